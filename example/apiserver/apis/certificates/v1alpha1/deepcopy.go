package v1alpha1

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies in into out.
func (in *ServingCertificateStatus) DeepCopyInto(out *ServingCertificateStatus) {
	*out = *in
	out.Names = slices.Clone(in.Names)
	out.SNINames = slices.Clone(in.SNINames)
	in.NotBefore.DeepCopyInto(&out.NotBefore)
	in.NotAfter.DeepCopyInto(&out.NotAfter)
}

// DeepCopyInto copies in into out.
func (in *ServingCertificate) DeepCopyInto(out *ServingCertificate) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a deep copy of in, or nil for nil.
func (in *ServingCertificate) DeepCopy() *ServingCertificate {
	if in == nil {
		return nil
	}
	out := new(ServingCertificate)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *ServingCertificate) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies in into out.
func (in *ServingCertificateList) DeepCopyInto(out *ServingCertificateList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]ServingCertificate, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a deep copy of in, or nil for nil.
func (in *ServingCertificateList) DeepCopy() *ServingCertificateList {
	if in == nil {
		return nil
	}
	out := new(ServingCertificateList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *ServingCertificateList) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}
