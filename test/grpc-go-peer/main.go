// grpc-go-peer is a kubelet-shaped CRI client for probe-agent's tests: one grpc-go ClientConn,
// dialed as kubelet dials its container runtime (k8s.io/kubernetes pkg/kubelet/cri/remote before
// 1.31, k8s.io/cri-client after), making generic unary calls that a test feeds it.
//
// Why it exists: kubelet's grpc-go sends BDP PINGs as DATA arrives and a grpc-go server (containerd)
// punishes PINGs it did not earn; grpc-js and node:http2, the suite's other clients, send no such
// PINGs. Only a real grpc-go client shows what kubelet's connection does through the shim.
//
// Protocol: JSON lines. stdin: {"id", "method" (full path, /runtime.v1.RuntimeService/X),
// "requestBase64", "timeoutMs" (0 or absent: no deadline, as kubelet's exec hooks)} or
// {"id", "control": "stats"}. stdout: {"id", "ok": true, "responseBase64"} |
// {"id", "ok": false, "code", "message"} | {"id", "ok": true, "stats"}. Calls run concurrently;
// answers come in completion order. On stdin EOF the peer waits for its calls, closes the
// connection, prints {"final": stats} and exits 0.
//
// With -health-server it is a pod's grpc-go health server instead (health.go).
//
// Built from Debian's golang-google-grpc-dev (grpc-go 1.33) in GOPATH mode: see the Makefile.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/status"
)

// kubelet's maxMsgSize (remote/utils.go, cri-client utils.go): 16 MiB.
const maxMsgSize = 16 * 1024 * 1024

type request struct {
	ID            uint64 `json:"id"`
	Method        string `json:"method"`
	RequestBase64 string `json:"requestBase64"`
	TimeoutMs     int64  `json:"timeoutMs"`
	Control       string `json:"control"`
}

type answer struct {
	ID             uint64  `json:"id"`
	OK             bool    `json:"ok"`
	ResponseBase64 *string `json:"responseBase64,omitempty"`
	Code           *int    `json:"code,omitempty"`
	Message        *string `json:"message,omitempty"`
	Stats          *Stats  `json:"stats,omitempty"`
}

var (
	outMu sync.Mutex
	out   = bufio.NewWriter(os.Stdout)
	errMu sync.Mutex
)

func emit(v interface{}) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	outMu.Lock()
	out.Write(b)
	out.WriteByte('\n')
	out.Flush()
	outMu.Unlock()
}

func main() {
	socket := flag.String("socket", "", "CRI socket path (the runtime's or the shim's)")
	authority := flag.String("authority", "path", "`path`: target = the socket path, so :authority is that path (kubelet < 1.31); "+
		"`localhost`: WithAuthority(\"localhost\") and cri-client's connect backoff (kubelet 1.31+)")
	logTransport := flag.Bool("log-transport", false, "log transport events (dials, GOAWAYs, closes, channel states) and grpc-go's own log to stderr")
	healthAddr := flag.String("health-server", "", "instead: serve grpc.health.v1 on this address (health.go)")
	flag.Parse()
	if *healthAddr != "" {
		serveHealth(*healthAddr)
		return
	}
	if *socket == "" || (*authority != "path" && *authority != "localhost") {
		flag.Usage()
		os.Exit(2)
	}

	logEvent := func(map[string]interface{}) {}
	if *logTransport {
		// Before any grpc-go call: SetLoggerV2 is not safe once grpc-go runs.
		grpclog.SetLoggerV2(grpclog.NewLoggerV2WithVerbosity(os.Stderr, os.Stderr, os.Stderr, 2))
		logEvent = func(e map[string]interface{}) {
			e["t"] = time.Now().UTC().Format(time.RFC3339Nano)
			b, _ := json.Marshal(e)
			errMu.Lock()
			fmt.Fprintf(os.Stderr, "grpc-go-peer %s\n", b)
			errMu.Unlock()
		}
	}

	stats := &transportStats{}
	connSeq := 0
	var seqMu sync.Mutex
	// kubelet's dialer (cri-client util_unix.go): a plain unix dial of the address grpc-go hands
	// it, which is the socket path with the passthrough resolver. Wrapped only to count frames.
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", addr)
		if err != nil {
			stats.update(func(s *Stats) { s.DialErrors++ })
			logEvent(map[string]interface{}{"event": "dial-error", "error": err.Error()})
			return nil, err
		}
		seqMu.Lock()
		connSeq++
		id := connSeq
		seqMu.Unlock()
		stats.update(func(s *Stats) { s.Dials++ })
		logEvent(map[string]interface{}{"event": "dial", "conn": id})
		tc := &tappedConn{Conn: c}
		tc.in = &frameParser{onFrame: func(typ, flags byte, _ uint32, length int, payload []byte) {
			switch typ {
			case frameGoAway:
				g := GoAway{Conn: id}
				if len(payload) >= 8 {
					g.LastStreamID = uint32(payload[0]&0x7f)<<24 | uint32(payload[1])<<16 | uint32(payload[2])<<8 | uint32(payload[3])
					g.Code = uint32(payload[4])<<24 | uint32(payload[5])<<16 | uint32(payload[6])<<8 | uint32(payload[7])
					g.Debug = string(payload[8:])
				}
				stats.update(func(s *Stats) { s.GoAways = append(s.GoAways, g) })
				logEvent(map[string]interface{}{"event": "goaway", "conn": id, "code": g.Code, "lastStreamId": g.LastStreamID, "debug": g.Debug})
			case framePing:
				stats.update(func(s *Stats) {
					if flags&flagAck != 0 {
						s.PingAcksRecv++
					} else {
						s.PingsRecv++
					}
				})
			case frameData:
				stats.update(func(s *Stats) { s.DataFramesRecv++; s.DataOctetsRecv += int64(length) })
			case frameSettings:
				if flags&flagAck == 0 {
					stats.update(func(s *Stats) { s.SettingsRecv++ })
				}
			}
		}}
		tc.out = &frameParser{skip: clientPrefaceLen, onFrame: func(typ, flags byte, _ uint32, _ int, payload []byte) {
			if typ == framePing && flags&flagAck == 0 {
				bdp := len(payload) == 8 && [8]byte{payload[0], payload[1], payload[2], payload[3], payload[4], payload[5], payload[6], payload[7]} == bdpPingData
				stats.update(func(s *Stats) {
					s.PingsSent++
					if bdp {
						s.BdpPingsSent++
					}
				})
			}
		}}
		tc.onClose = func(err error) {
			stats.update(func(s *Stats) { s.ConnsClosed++ })
			reason := "closed by the client"
			if err != nil {
				reason = err.Error()
			}
			logEvent(map[string]interface{}{"event": "conn-closed", "conn": id, "reason": reason})
		}
		return tc, nil
	}

	// kubelet's dial options. 1.26: grpc.DialContext(ctx, addr, insecure, WithContextDialer,
	// MaxCallRecvMsgSize(16 MiB)); nothing else, so grpc-go's default BDP estimation (dynamic
	// windows) and no client keepalive. 1.31+ (cri-client) adds WithAuthority("localhost") and a
	// connect backoff (base 100 ms, max 3 s, min connect timeout 5 s).
	// grpc-go 1.33 has no credentials/insecure (added in 1.34); WithInsecure is the same thing there.
	opts := []grpc.DialOption{
		grpc.WithInsecure(),
		grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize)),
	}
	if *authority == "localhost" {
		bo := backoff.DefaultConfig
		bo.BaseDelay = 100 * time.Millisecond
		bo.MaxDelay = 3 * time.Second
		opts = append(opts, grpc.WithAuthority("localhost"), grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := grpc.DialContext(ctx, *socket, opts...)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpc-go-peer: dial %s: %v\n", *socket, err)
		os.Exit(1)
	}
	if *logTransport {
		go func() {
			for st := conn.GetState(); ; st = conn.GetState() {
				logEvent(map[string]interface{}{"event": "state", "state": st.String()})
				if st == connectivity.Shutdown || !conn.WaitForStateChange(context.Background(), st) {
					return
				}
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "grpc-go-peer ready: grpc-go %s, socket %s, authority %s\n", grpc.Version, *socket, *authority)

	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintf(os.Stderr, "grpc-go-peer: bad request line: %v\n", err)
			os.Exit(2)
		}
		if req.Control == "stats" {
			s := stats.snapshot()
			emit(answer{ID: req.ID, OK: true, Stats: &s})
			continue
		}
		body, err := base64.StdEncoding.DecodeString(req.RequestBase64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "grpc-go-peer: request %d: requestBase64: %v\n", req.ID, err)
			os.Exit(2)
		}
		wg.Add(1)
		stats.update(func(s *Stats) { s.CallsStarted++ })
		go func(req request, body []byte) {
			defer wg.Done()
			emit(invoke(conn, req, body))
			stats.update(func(s *Stats) { s.CallsFinished++ })
		}(req, body)
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "grpc-go-peer: stdin: %v\n", err)
		os.Exit(2)
	}
	wg.Wait()
	conn.Close()
	s := stats.snapshot()
	emit(map[string]interface{}{"final": s})
}

// invoke makes one unary call as kubelet's generated stubs do (ClientConn.Invoke), with a
// deadline of timeoutMs or none.
func invoke(conn *grpc.ClientConn, req request, body []byte) answer {
	ctx, cancel := context.WithCancel(context.Background())
	if req.TimeoutMs > 0 {
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(req.TimeoutMs)*time.Millisecond)
	}
	defer cancel()
	var resp []byte
	if err := conn.Invoke(ctx, req.Method, body, &resp); err != nil {
		st := status.Convert(err)
		code := int(st.Code())
		msg := st.Message()
		return answer{ID: req.ID, OK: false, Code: &code, Message: &msg}
	}
	b := base64.StdEncoding.EncodeToString(resp)
	return answer{ID: req.ID, OK: true, ResponseBase64: &b}
}
