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
// to Options.ShutdownTimeout to finish, closes what is left, and returns
// nil: connections cut at the timeout are named in a warning (their count,
// remote addresses and net/http states), not returned as an error. When start-up fails it returns at once: the error
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

	conns := &connTracker{}
	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         s.Controller.TLSConfig(),
		ReadHeaderTimeout: 32 * time.Second,
		ErrorLog:          newHTTPErrorLog(logger),
		ConnState:         conns.hook,
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
		_ = s.shutdown(logger, srv, conns)
		return serveErr
	}
	logger.Info("Shutting down; waiting for in-flight requests", "timeout", s.opts.ShutdownTimeout)
	err = s.shutdown(logger, srv, conns)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// shutdown stops srv gracefully within ShutdownTimeout, then closes every
// connection still open, so that no request outlives Serve's caller for
// long, and logs a warning naming them. Cutting them is not an error: the
// timeout is the bound the operator chose. What can hold a graceful
// shutdown that long (see http.Server.Shutdown): a request still running
// or an HTTP/2 stream whose client does not read the response (active); an
// HTTP/2 connection whose client never sent its preface, which net/http
// keeps for up to 10 s; a TLS handshake or first request not finished, for
// up to 5 s (new). It returns the error of closing the listeners, if any.
func (s *Serving) shutdown(logger klog.Logger, srv *http.Server, conns *connTracker) error {
	ctx, stop := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer stop()
	err := srv.Shutdown(ctx)
	if err == nil {
		return nil
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		return errors.Join(err, srv.Close())
	}
	cut := conns.open()
	closeErr := srv.Close()
	logger.Info("Warning: connections still open after --shutdown-timeout were closed", "timeout", s.opts.ShutdownTimeout, "count", len(cut), "connections", cut)
	return closeErr
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
