package dynamiccert

import (
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// listeners is the set of listeners a provider notifies on change. The zero
// value is ready to use and safe for concurrent use.
type listeners struct {
	mu sync.Mutex
	ls []dynamiccertificates.Listener
}

// AddListener adds l to be notified when the content changes.
func (l *listeners) AddListener(listener dynamiccertificates.Listener) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ls = append(l.ls, listener)
}

// notify calls Enqueue on every listener. Listeners must not block (upstream
// ones add to a work queue), so they are called inline.
func (l *listeners) notify() {
	l.mu.Lock()
	ls := l.ls
	l.mu.Unlock()
	for _, listener := range ls {
		listener.Enqueue()
	}
}
