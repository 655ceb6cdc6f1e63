// Run by tests/test_e2e_capture.py. A Go program with Go's own dialer and its
// own resolver (CGO_ENABLED=0: it reads /etc/resolv.conf and asks the DNS door
// itself, never the C library).

package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	resp, err := http.Get("http://api.github.com/whoami")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(string(body))
}
