package ipmi

import (
	"context"
	"errors"
	"fmt"
)

// RotateCredential sets a new password for the account the driver logs in with (Set User
// Password on the user of the current session), then opens a new session with it to verify.
// After a verified rotation the driver uses the new password. The password never appears in
// errors or logs.
func (d *Driver) RotateCredential(ctx context.Context, newPassword string) error {
	const op = "rotating credential"
	if err := checkPassword(newPassword); err != nil {
		return fmt.Errorf("%s on %s: new password: %w", op, d.addr, err)
	}
	old := d.currentPassword()
	err := d.withSessionAs(ctx, op, old, func(ctx context.Context, s *session) error {
		var userID uint8
		err := s.do(ctx, "Get Session Info", func(ctx context.Context) error {
			r, err := s.c.GetCurrentSessionInfo(ctx)
			if err != nil {
				return err
			}
			userID = r.UserID
			return nil
		})
		if err != nil {
			return err
		}
		if userID == 0 {
			return errors.New("the BMC did not report the user ID of this session")
		}
		return s.do(ctx, fmt.Sprintf("Set User Password (user %d)", userID), func(ctx context.Context) error {
			_, err := s.c.SetUserPassword(ctx, userID, newPassword, len(newPassword) > 16)
			return err
		})
	})
	if err != nil {
		return err
	}
	d.log.Info("BMC password changed; verifying with a new session")

	verify := func(ctx context.Context, s *session) error {
		_, err := s.poweredOn(ctx)
		return err
	}
	if err := d.withSessionAs(ctx, "verifying the new credential", newPassword, verify); err != nil {
		// Tell the operator which password the BMC holds now, if we can.
		if oldErr := d.withSessionAs(ctx, "checking the old credential", old, verify); oldErr == nil {
			return fmt.Errorf("%s on %s: the BMC answered Set User Password but still accepts only the old password: %w", op, d.addr, err)
		}
		return fmt.Errorf("%s on %s: the password was changed but logging in with the new one failed and the old one no longer works (the BMC may need a manual reset): %w", op, d.addr, err)
	}
	d.mu.Lock()
	d.password = newPassword
	d.mu.Unlock()
	d.log.Info("BMC credential rotated and verified")
	return nil
}
