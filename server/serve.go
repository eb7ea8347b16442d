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

// Serve loads s (RunOnce), keeps it current (Run) and serves handler over
// HTTPS until ctx is done or serving fails. It opens no listener before the
// first certificate is loaded, nor at all when ctx ends first; it then
// returns nil.
//
// When ctx ends it stops accepting connections, gives in-flight requests up
// to Options.ShutdownTimeout to finish, closes what is left, and returns nil
// after a clean shutdown. When start-up fails it returns at once: the error
// of RunOnce (no certificate, an unwritable --ca-bundle-file), of the listen
// ("listening on HOST:PORT: ..."), or of http.Server.ServeTLS ("serving on
// HOST:PORT: ..."). In every case the goroutines Serve started, Run's
// included, have stopped when it returns, and Listening is never closed if
// the listen failed.
func (s *Serving) Serve(ctx context.Context, handler http.Handler) error {
	logger := klog.FromContext(ctx)
	var wg sync.WaitGroup
	// Deferred calls run last-in first-out: cancel first, then wait.
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	err := s.RunOnce(ctx)
	if ctx.Err() != nil {
		// Shut down before serving (a signal during start-up): not a
		// start-up failure, whatever RunOnce made of the ended context.
		return nil
	}
	if err != nil {
		return err
	}
	wg.Go(func() { s.Run(ctx, 1) })

	addr := net.JoinHostPort(s.opts.BindAddress.String(), strconv.Itoa(s.opts.SecurePort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	// http.Server.Serve closes the listener, but ServeTLS can fail before
	// it gets there (an HTTP/2 set-up error, say).
	defer ln.Close()
	s.setAddr(ln.Addr())
	logger.Info("serving on https://"+ln.Addr().String(), "address", ln.Addr().String())

	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         s.Controller.TLSConfig(),
		ReadHeaderTimeout: 32 * time.Second,
		ErrorLog:          newHTTPErrorLog(logger),
	}
	served := make(chan error, 1)
	// ServeTLS, unlike Serve on a tls.Listener, also sets up HTTP/2.
	wg.Go(func() { served <- srv.ServeTLS(ln, "", "") })
	var serveErr error
	select {
	case err := <-served:
		serveErr = fmt.Errorf("serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	if serveErr != nil {
		// Whatever connections are still open get the graceful treatment
		// too; after a set-up failure there are none.
		_ = s.shutdown(srv)
		return serveErr
	}
	logger.Info("Shutting down; waiting for in-flight requests", "timeout", s.opts.ShutdownTimeout)
	err = s.shutdown(srv)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// shutdown stops srv gracefully within ShutdownTimeout, then closes any
// connection still open so that no request outlives Serve's caller for
// long.
func (s *Serving) shutdown(srv *http.Server) error {
	ctx, stop := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer stop()
	err := srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, srv.Close())
	}
	return err
}

// Addr returns the address the server listens on once Listening is closed.
func (s *Serving) Addr() net.Addr {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return s.addr
}

// Listening is closed when Serve has opened its listener. It stays open if
// Serve fails before that.
func (s *Serving) Listening() <-chan struct{} { return s.listening }

func (s *Serving) setAddr(a net.Addr) {
	s.addrMu.Lock()
	s.addr = a
	s.addrMu.Unlock()
	close(s.listening)
}
