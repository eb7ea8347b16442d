package certmetrics

import "k8s.io/component-base/metrics"

var (
	emergencySteps = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "emergency_rotation_steps_total",
		Help:           "Steps of emergency CA rotations after an operator marked a CA compromised, by provider and step (published: a successor joined the bundle; signing: it signs; reissued: this replica's leaf left the compromised CA; untrusted: the compromised CA left the bundle). Counted by the replica that took the step.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider", "step"})

	operatorRequests = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      namespace,
		Name:           "operator_requests_total",
		Help:           "Operator requests on an Authority's CA Secret seen by this replica, by provider, request (rotate, compromised) and result (handled; ignored: a compromised-CA fingerprint that matches no CA in the Secret).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider", "request", "result"})

	compromisedTrusted = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      namespace,
		Name:           "compromised_ca_trusted",
		Help:           "1 while the CA bundle a provider publishes still holds a CA marked compromised (the emergency rotation waits for every live replica to serve a leaf from its successor), 0 otherwise.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"provider"})
)

// EmergencyRotationStep counts one step of an emergency rotation.
func EmergencyRotationStep(provider, step string) {
	Register()
	emergencySteps.WithLabelValues(provider, step).Inc()
}

// OperatorRequest counts one operator request and its result.
func OperatorRequest(provider, request, result string) {
	Register()
	operatorRequests.WithLabelValues(provider, request, result).Inc()
}

// CompromisedCATrusted sets whether provider's bundle holds a compromised CA.
func CompromisedCATrusted(provider string, trusted bool) {
	Register()
	v := 0.0
	if trusted {
		v = 1
	}
	compromisedTrusted.WithLabelValues(provider).Set(v)
}
