// Package notify holds the set of dynamiccertificates.Listener that a
// provider, a publisher or a file writer tells about a change.
//
// See docs/architecture.md for how the packages fit together.
package notify

import (
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// Listeners is a set of listeners to notify on change. The zero value is
// ready to use, and a Listeners is safe for concurrent use.
type Listeners struct {
	mu sync.Mutex
	ls []dynamiccertificates.Listener
}

// Add registers l to be notified at every later change.
func (l *Listeners) Add(listener dynamiccertificates.Listener) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ls = append(l.ls, listener)
}

// Notify calls Enqueue on every listener, inline and outside the lock:
// listeners must not block (upstream ones add to a work queue), and may add
// listeners themselves.
func (l *Listeners) Notify() {
	l.mu.Lock()
	ls := l.ls
	l.mu.Unlock()
	for _, listener := range ls {
		listener.Enqueue()
	}
}
