package batch

import (
	"fmt"

	"bcd/internal/catalog"
)

// ImageDigest is the digest that names what a catalog image writes: "sha256:HEX", or
// "sha512:HEX" for an image that has only a sha512. A deploy pins it when the verb is applied;
// the image's URL may change (another mirror) without changing what is written.
func ImageDigest(img catalog.Image) string {
	if img.SHA256 != "" {
		return "sha256:" + img.SHA256
	}
	if img.SHA512 != "" {
		return "sha512:" + img.SHA512
	}
	return ""
}

// ImageChangedError is a catalog image replaced (same name, another digest) after a deploy
// pinned it: what was asked, and approved, is not what the catalog would now write.
type ImageChangedError struct {
	Name, Pinned, Now string
}

func (e *ImageChangedError) Error() string {
	return fmt.Sprintf("image %s was replaced in the catalog after the deploy was asked: pinned %s, the catalog now has %s; nothing was written (recover the node, then deploy again to write the new image)", e.Name, e.Pinned, e.Now)
}

// CheckPin decides whether img, the catalog's image of that name now, is the one a deploy
// pinned (pinned: ImageDigest then; "" for a deploy asked before pins existed, which is not
// checked).
func CheckPin(pinned string, img catalog.Image) error {
	if pinned == "" {
		return nil
	}
	if now := ImageDigest(img); now != pinned {
		return &ImageChangedError{Name: img.Name, Pinned: pinned, Now: now}
	}
	return nil
}
