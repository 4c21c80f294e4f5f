//! libmetalift: injected into processes, checks in with metaliftd, and unlocks Metal
//! capabilities only when the verdict says so.
