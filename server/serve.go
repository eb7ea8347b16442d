package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Serve runs s and serves handler over HTTPS until ctx is done. It opens no
// listener before the first certificate is loaded. When ctx ends it stops
// accepting connections and gives in-flight requests up to ShutdownTimeout
// to finish. It returns nil after a clean shutdown.
func (s *Serving) Serve(ctx context.Context, handler http.Handler) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	runErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { runErr <- s.Run(ctx) })
	select {
	case <-s.Synced():
	case err := <-runErr:
		return err
	case <-ctx.Done():
		return nil
	}

	addr := net.JoinHostPort(s.opts.BindAddress.String(), strconv.Itoa(s.opts.SecurePort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	s.setAddr(ln.Addr())
	klog.InfoS("serving on https://"+ln.Addr().String(), "address", ln.Addr().String())

	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         s.Controller.TLSConfig(),
		ReadHeaderTimeout: 32 * time.Second,
		ErrorLog:          newHTTPErrorLog(),
	}
	served := make(chan error, 1)
	// ServeTLS, unlike Serve on a tls.Listener, also sets up HTTP/2.
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-served:
		return fmt.Errorf("serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, stop := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer stop()
	klog.InfoS("Shutting down; waiting for in-flight requests", "timeout", s.opts.ShutdownTimeout)
	err = srv.Shutdown(shutdownCtx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// Addr returns the address the server listens on once Listening is closed.
func (s *Serving) Addr() net.Addr {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return s.addr
}

// Listening is closed when Serve has opened its listener.
func (s *Serving) Listening() <-chan struct{} { return s.listening }

func (s *Serving) setAddr(a net.Addr) {
	s.addrMu.Lock()
	s.addr = a
	s.addrMu.Unlock()
	close(s.listening)
}
