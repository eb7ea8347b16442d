package pkcs11_test

import (
	"context"
	"log"

	"k8s.io/client-go/kubernetes"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/pkcs11"
)

// An Authority whose CA keys live in a PKCS#11 token (here SoftHSM2's, at
// DefaultModule): the CA Secret holds the certificates and the keys'
// labels only. Every replica opens the same token with the same PIN file.
func ExampleKeySource() {
	var client kubernetes.Interface // from the in-cluster config
	keys, err := pkcs11.New(pkcs11.Config{
		TokenLabel: "evercert",
		PINFile:    "/var/run/secrets/hsm/pin", // mounted from a Secret only this workload reads
	})
	if err != nil {
		log.Fatal(err)
	}
	defer keys.Close()
	ca, err := authority.New(authority.Config{
		Namespace: "webhooks", SecretName: "webhook-ca", Client: client,
		Hosts:  []string{"webhook.webhooks.svc"},
		CAKeys: keys,
	})
	if err != nil {
		log.Fatal(err)
	}
	go ca.Run(context.Background(), 1)
	// Serve ca through the sni controller, as any Authority.
}
