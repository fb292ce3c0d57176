package secrets

import "context"

// RotateCrashing is Rotate with the crash seam set: crash is called at each step (StepAddKey,
// "reseal-row" in each row's transaction, "reseal-batch" after each batch that changed rows,
// StepVerify, StepTrimRing) and an error stops the rotation there.
func RotateCrashing(ctx context.Context, cfg RotateConfig, crash func(step string) error) (Rotation, error) {
	cfg.crash = crash
	return Rotate(ctx, cfg)
}
