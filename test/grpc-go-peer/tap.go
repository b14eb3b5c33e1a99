package main

import (
	"encoding/binary"
	"net"
	"sync"
)

// The frame tap reads the HTTP/2 frames that cross the client's socket in both directions,
// without changing a byte, so a test can count what the peer on the other side did to the
// connection (GOAWAY and its reason) and what grpc-go itself sent (BDP PINGs), independently of
// grpc-go's logging.

const (
	frameData     = 0x0
	frameSettings = 0x4
	framePing     = 0x6
	frameGoAway   = 0x7
	flagAck       = 0x1
	// The client connection preface, which precedes the first outbound frame.
	clientPrefaceLen = 24
	// How much of a GOAWAY or PING payload is kept (GOAWAY debug data is free text).
	keepMax = 1024
)

// bdpPingData is the payload grpc-go's BDP estimator puts in its PINGs
// (internal/transport/bdp_estimator.go), so BDP PINGs can be told from keepalive PINGs.
var bdpPingData = [8]byte{2, 4, 16, 16, 9, 14, 7, 7}

// GoAway is one GOAWAY frame the client received.
type GoAway struct {
	Conn         int    `json:"conn"`
	Code         uint32 `json:"code"`
	LastStreamID uint32 `json:"lastStreamId"`
	Debug        string `json:"debug"`
}

// Stats counts transport events over the peer's life.
type Stats struct {
	Dials           int      `json:"dials"`
	DialErrors      int      `json:"dialErrors"`
	ConnsClosed     int      `json:"connsClosed"`
	GoAways         []GoAway `json:"goaways"`
	PingsSent       int      `json:"pingsSent"`
	BdpPingsSent    int      `json:"bdpPingsSent"`
	PingAcksRecv    int      `json:"pingAcksReceived"`
	PingsRecv       int      `json:"pingsReceived"`
	DataFramesRecv  int      `json:"dataFramesReceived"`
	DataOctetsRecv  int64    `json:"dataOctetsReceived"`
	SettingsRecv    int      `json:"settingsReceived"`
	CallsStarted    int      `json:"callsStarted"`
	CallsFinished   int      `json:"callsFinished"`
}

type transportStats struct {
	mu sync.Mutex
	s  Stats
}

func (t *transportStats) snapshot() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	s.GoAways = append([]GoAway{}, t.s.GoAways...)
	return s
}

func (t *transportStats) update(f func(s *Stats)) {
	t.mu.Lock()
	f(&t.s)
	t.mu.Unlock()
}

// frameParser follows one direction of a connection; feed is called with the octets in order.
type frameParser struct {
	skip      int // preface octets still to skip
	hdr       [9]byte
	hn        int
	inPayload bool
	remaining int
	typ       byte
	flags     byte
	streamID  uint32
	keep      []byte
	onFrame   func(typ, flags byte, streamID uint32, length int, payload []byte)
}

func (p *frameParser) feed(b []byte) {
	for len(b) > 0 {
		if p.skip > 0 {
			n := min(p.skip, len(b))
			p.skip -= n
			b = b[n:]
			continue
		}
		if !p.inPayload {
			n := copy(p.hdr[p.hn:], b)
			p.hn += n
			b = b[n:]
			if p.hn < 9 {
				continue
			}
			p.hn = 0
			p.remaining = int(p.hdr[0])<<16 | int(p.hdr[1])<<8 | int(p.hdr[2])
			p.typ, p.flags = p.hdr[3], p.hdr[4]
			p.streamID = binary.BigEndian.Uint32(p.hdr[5:9]) & 0x7fffffff
			p.keep = p.keep[:0]
			p.inPayload = true
			if p.remaining == 0 {
				p.emit(0)
			}
			continue
		}
		n := min(p.remaining, len(b))
		if (p.typ == frameGoAway || p.typ == framePing) && len(p.keep) < keepMax {
			p.keep = append(p.keep, b[:min(n, keepMax-len(p.keep))]...)
		}
		p.remaining -= n
		b = b[n:]
		if p.remaining == 0 {
			p.emit(int(p.hdr[0])<<16 | int(p.hdr[1])<<8 | int(p.hdr[2]))
		}
	}
}

func (p *frameParser) emit(length int) {
	p.inPayload = false
	p.onFrame(p.typ, p.flags, p.streamID, length, p.keep)
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// tappedConn is the dialed socket with a parser on each direction. Read runs only on grpc-go's
// reader goroutine and Write only on its writer goroutine, so each parser has a single user.
type tappedConn struct {
	net.Conn
	in, out   *frameParser
	closeOnce sync.Once
	onClose   func(err error)
}

func (c *tappedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.in.feed(b[:n])
	}
	if err != nil {
		c.closeOnce.Do(func() { c.onClose(err) })
	}
	return n, err
}

func (c *tappedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.out.feed(b[:n])
	}
	return n, err
}

func (c *tappedConn) Close() error {
	c.closeOnce.Do(func() { c.onClose(nil) })
	return c.Conn.Close()
}
