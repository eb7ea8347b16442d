package testcluster

// Dir exposes the cluster's temporary directory to the external tests.
func Dir(c *Cluster) string { return c.dir }
