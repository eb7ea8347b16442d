package authority

import (
	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/evercert/evercert/internal/notify"
)

// listeners is the set of listeners a provider notifies on change; embedded
// in a provider, it gives the provider its AddListener method and nothing
// else exported. The zero value is ready to use and safe for concurrent use.
type listeners struct{ set notify.Listeners }

// AddListener adds l to be notified when the content changes.
func (l *listeners) AddListener(listener dynamiccertificates.Listener) { l.set.Add(listener) }

// notify calls Enqueue on every listener, inline: listeners must not block.
func (l *listeners) notify() { l.set.Notify() }
