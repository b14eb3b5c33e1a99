package main

// -health-server ADDR: a grpc-go grpc.health.v1 server, as pods run it, for the gRPC probe's tests
// (kubelet's prober is a grpc-go client; the pod's server most often is grpc-go too). Services: ""
// SERVING, "db" NOT_SERVING; any other is NotFound (grpc-go's health server). Prints
// {"listening": port} once it listens, and stops when stdin ends.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func serveHealth(addr string) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen %s: %v\n", addr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, h)
	line, _ := json.Marshal(map[string]int{"listening": lis.Addr().(*net.TCPAddr).Port})
	fmt.Println(string(line))
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil && err != grpc.ErrServerStopped {
		fmt.Fprintf(os.Stderr, "serve: %v\n", err)
		os.Exit(1)
	}
}
