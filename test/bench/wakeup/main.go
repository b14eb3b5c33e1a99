// The wake-up floor's Go receiver: one unix-socket connection, a byte back for every read (the
// runtime's netpoller, as kubelet's and containerd's connections use it).
package main

import (
	"fmt"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		os.Exit(2)
	}
	l, err := net.Listen("unix", os.Args[1])
	if err != nil {
		os.Exit(1)
	}
	fmt.Println("ready")
	c, err := l.Accept()
	if err != nil {
		os.Exit(1)
	}
	b := make([]byte, 256)
	for {
		if _, err := c.Read(b); err != nil {
			return
		}
		if _, err := c.Write([]byte{'k'}); err != nil {
			os.Exit(1)
		}
	}
}
