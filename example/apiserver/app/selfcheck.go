package app

import (
	"context"
	"time"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certmetrics"
)

// SelfcheckHookName is the post-start hook that runs the loopback
// self-check.
const SelfcheckHookName = "evercert-loopback-selfcheck"

// selfcheckTimeout bounds one self-check request.
const selfcheckTimeout = 5 * time.Second

// selfcheckHook builds one clientset from the loopback config and, every
// interval until the server stops, asks the server for its version through
// it, counting each result in evercert_loopback_selfcheck_total and logging
// failures. Requests cut short by shutdown are not counted. The hook returns
// at once; its goroutine ends with the hook context.
func selfcheckHook(interval time.Duration) genericapiserver.PostStartHookFunc {
	return func(hookCtx genericapiserver.PostStartHookContext) error {
		cs, err := kubernetes.NewForConfig(hookCtx.LoopbackClientConfig)
		if err != nil {
			return err
		}
		go selfcheckLoop(hookCtx, cs, interval)
		return nil
	}
}

func selfcheckLoop(ctx context.Context, cs kubernetes.Interface, interval time.Duration) {
	logger := klog.FromContext(ctx).WithName("loopback-selfcheck")
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		reqCtx, cancel := context.WithTimeout(ctx, selfcheckTimeout)
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/version").Do(reqCtx).Raw()
		cancel()
		if ctx.Err() != nil {
			return // shutting down
		}
		certmetrics.LoopbackSelfcheck(err == nil)
		if err != nil {
			logger.Error(err, "Loopback self-check failed")
		}
	}
}
