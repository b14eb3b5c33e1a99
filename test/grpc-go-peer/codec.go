package main

import (
	"fmt"

	"google.golang.org/grpc/encoding"
)

// rawCodec passes request and response messages through as bytes, so the peer needs no
// generated CRI types: the TypeScript side encodes and decodes them with the repo's proto.
// Typed messages (the -health-server mode's) go to grpc-go's own protobuf codec.
// It is registered under grpc-go's default codec name, "proto", so calls keep the plain
// `content-type: application/grpc` that kubelet sends (a codec of another name would make
// grpc-go send `application/grpc+<name>`).
type rawCodec struct{ typed encoding.Codec }

func (rawCodec) Name() string { return "proto" }

func (c rawCodec) Marshal(v interface{}) ([]byte, error) {
	switch m := v.(type) {
	case []byte:
		return m, nil
	case *[]byte:
		return *m, nil
	}
	if c.typed != nil {
		return c.typed.Marshal(v)
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

func (c rawCodec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(*[]byte)
	if !ok {
		if c.typed != nil {
			return c.typed.Unmarshal(data, v)
		}
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	// grpc-go may reuse its receive buffer: keep a copy.
	*m = append([]byte(nil), data...)
	return nil
}

// init runs after grpc-go's encoding/proto init (an imported package), so this registration
// replaces the protobuf codec for every call of this process.
func init() { encoding.RegisterCodec(rawCodec{typed: encoding.GetCodec("proto")}) }
