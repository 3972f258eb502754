package controller

import "github.com/blobplane/blobplane/config"

// SettingsFrom is the controller service's settings from cfg's
// BLOBPLANE_CONTROLLER_* values (zero fields take DefaultSettings'). The
// controller binary and the api's GET /v1/admin/plan build theirs with it.
func SettingsFrom(cfg *config.Config) Settings {
	s := Settings{
		Tick: cfg.ControllerTick, HandoffDeadline: cfg.HandoffDeadline, FailoverGrace: cfg.ControllerFailoverGrace,
		LiveNodeGrace: cfg.ControllerLiveGrace, MaxConcurrent: cfg.ControllerMaxMoves,
		MaxPerNode: cfg.ControllerMaxPerNode, MaxMoveFraction: cfg.ControllerMaxFraction,
		BalanceCooldown: cfg.ControllerBalanceCooldown,
	}
	if cfg.ControllerAuto != nil {
		s.Auto = map[string]bool{}
		for _, k := range cfg.ControllerAuto {
			s.Auto[k] = true
		}
	}
	return s
}
