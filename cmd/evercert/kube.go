package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// errHelp is returned after --help printed the usage: exit 0.
var errHelp = errors.New("help requested")

// commonFlags are the flags every command takes: where the cluster is, and
// how to print.
type commonFlags struct {
	kubeconfig, context, namespace, output string
}

func (c *commonFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&c.context, "context", "", "the kubeconfig context to use (default the current context)")
	fs.StringVarP(&c.namespace, "namespace", "n", "", "the namespace of the CA Secret and its Leases (default the context's namespace)")
	fs.StringVarP(&c.output, "output", "o", "text", "output format: text or json")
}

// newFlagSet makes a command's flag set: errors are returned, not
// printed and exited on, so they map to exit code 2.
func newFlagSet(prog, cmd, args string, common *commonFlags) *pflag.FlagSet {
	fs := pflag.NewFlagSet(prog+" "+cmd, pflag.ContinueOnError)
	fs.SetInterspersed(true)
	common.add(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s %s %s\n\nFlags:\n%s", prog, cmd, args, fs.FlagUsages())
	}
	return fs
}

// parse parses args, mapping a parse error to a usage error and --help to
// errHelp, and checks the output format and the number of positional
// arguments.
func parse(fs *pflag.FlagSet, common *commonFlags, args []string, positional int) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, errHelp
		}
		return nil, usagef("%v", err)
	}
	if common.output != "text" && common.output != "json" {
		return nil, usagef("--output %q: want text or json", common.output)
	}
	if fs.NArg() != positional {
		return nil, usagef("%s takes %d argument(s), got %d (%q); see --help", fs.Name(), positional, fs.NArg(), fs.Args())
	}
	return fs.Args(), nil
}

// kube holds the clients of one command and the namespace it works in.
type kube struct {
	config    *rest.Config
	client    kubernetes.Interface
	namespace string
}

// connect loads the kubeconfig with kubectl's rules ($KUBECONFIG, then
// ~/.kube/config; --kubeconfig and --context override them) and makes the
// clients.
func (c *commonFlags) connect() (*kube, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if c.kubeconfig != "" {
		rules.ExplicitPath = c.kubeconfig
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: c.context}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "evercert-cli"
	ns := c.namespace
	if ns == "" {
		if ns, _, err = loader.Namespace(); err != nil {
			return nil, fmt.Errorf("the kubeconfig's namespace: %w", err)
		}
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("making a client: %w", err)
	}
	return &kube{config: cfg, client: client, namespace: ns}, nil
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}
