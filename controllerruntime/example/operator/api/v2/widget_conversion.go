package v2

import (
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/conversion"

	v1 "github.com/evercert/evercert/controllerruntime/example/operator/api/v1"
)

var _ conversion.Convertible = &Widget{}

// ConvertTo converts this v2 Widget to the hub (v1).
func (w *Widget) ConvertTo(dstRaw conversion.Hub) error {
	dst, ok := dstRaw.(*v1.Widget)
	if !ok {
		return fmt.Errorf("converting a v2 Widget: unexpected hub type %T", dstRaw)
	}
	dst.ObjectMeta = w.ObjectMeta
	dst.Spec.Size = w.Spec.Replicas
	dst.Spec.Color = w.Spec.Colour
	return nil
}

// ConvertFrom converts the hub (v1) to this v2 Widget.
func (w *Widget) ConvertFrom(srcRaw conversion.Hub) error {
	src, ok := srcRaw.(*v1.Widget)
	if !ok {
		return fmt.Errorf("converting to a v2 Widget: unexpected hub type %T", srcRaw)
	}
	w.ObjectMeta = src.ObjectMeta
	w.Spec.Replicas = src.Spec.Size
	w.Spec.Colour = src.Spec.Color
	return nil
}
