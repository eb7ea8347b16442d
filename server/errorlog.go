package server

import (
	"log"
	"strings"

	"k8s.io/klog/v2"
)

// newHTTPErrorLog routes net/http's error log through klog. TLS handshake
// failures from scanners and misconfigured clients are routine on a public
// port, so they go to V(4) rather than the error stream.
func newHTTPErrorLog() *log.Logger {
	return log.New(httpErrorWriter{}, "", 0)
}

type httpErrorWriter struct{}

func (httpErrorWriter) Write(p []byte) (int, error) {
	msg := strings.TrimRight(string(p), "\n")
	if strings.Contains(msg, "TLS handshake error") {
		klog.V(4).InfoS(msg)
	} else {
		klog.ErrorS(nil, msg)
	}
	return len(p), nil
}
