package vbmc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
)

// FakeSerial is a machine's serial port for a virtual BMC without a VM (ipmibmc.Config.Serial):
// each time the BMC opens it, the machine prints "\r\n" and prompt, then answers each line typed
// (ended by CR) with "\r\ntyped: LINE\r\n", and passes the line, CR included, to typed when it
// is not nil (a test reads what reached the machine).
func FakeSerial(prompt string, typed chan<- string) func(ctx context.Context) (io.ReadWriteCloser, error) {
	return func(context.Context) (io.ReadWriteCloser, error) {
		bmcEnd, machine := net.Pipe()
		go func() {
			defer machine.Close()
			if _, err := fmt.Fprint(machine, "\r\n"+prompt); err != nil {
				return
			}
			r := bufio.NewReader(machine)
			for {
				line, err := r.ReadString('\r')
				if err != nil {
					return
				}
				if typed != nil {
					typed <- line
				}
				if _, err := fmt.Fprintf(machine, "\r\ntyped: %s\r\n", strings.TrimSuffix(line, "\r")); err != nil {
					return
				}
			}
		}()
		return bmcEnd, nil
	}
}
