package server

import (
	"log"
	"strings"

	"k8s.io/klog/v2"
)

// newHTTPErrorLog routes net/http's error log to logger. TLS handshake
// failures from scanners and misconfigured clients are routine on a public
// port, so they go to V(4) rather than the error stream.
func newHTTPErrorLog(logger klog.Logger) *log.Logger {
	return log.New(httpErrorWriter{logger}, "", 0)
}

type httpErrorWriter struct{ logger klog.Logger }

func (w httpErrorWriter) Write(p []byte) (int, error) {
	msg := strings.TrimRight(string(p), "\n")
	if strings.Contains(msg, "TLS handshake error") {
		w.logger.V(4).Info(msg)
	} else {
		w.logger.Error(nil, msg)
	}
	return len(p), nil
}
