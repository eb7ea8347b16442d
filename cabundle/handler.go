package cabundle

import "k8s.io/client-go/tools/cache"

// eventHandler is t's informer event handler. Every event records what the
// object now holds (observe.go) and verifies it (verify.go), an update is checked for another writer
// changing the caBundle away from the published bundle (contest.go), and
// the target is queued for the worker (worker.go).
func (p *Publisher) eventHandler(t *targetState) cache.ResourceEventHandler {
	enqueue := func() { p.queue.Add(t.index) }
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if v, ok := t.adapter.view(obj); ok {
				p.observe(t, v.name, &v)
				p.verify(t, v)
			}
			enqueue()
		},
		UpdateFunc: func(oldObj, newObj any) {
			if cur, ok := t.adapter.view(newObj); ok {
				p.observe(t, cur.name, &cur)
				p.verify(t, cur)
				if old, ok := t.adapter.view(oldObj); ok {
					p.detectRevert(t, old, cur)
				}
			}
			enqueue()
		},
		DeleteFunc: func(obj any) {
			// Drop the bookkeeping of the object, so that objects coming
			// and going under a selector do not accumulate. The target is
			// queued because a deleted named object goes back to waiting,
			// which is worth a log line.
			if name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				p.observe(t, name, nil)
				p.forget(objectKey(t.Kind, name))
				p.forgetVerification(t.Kind, name)
			}
			enqueue()
		},
	}
}
