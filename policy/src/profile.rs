//! Capability profiles: what an unlocked process is told about its GPU.

/// The first Apple GPU family value `MTLGPUFamilyApple1` (1001); AppleN is 1000 + N.
pub const APPLE_FAMILY_BASE: i64 = 1000;
/// Lowest Apple family a profile may name (the paravirtual device already answers Apple5).
pub const MIN_APPLE_FAMILY: u8 = 5;
/// Highest Apple family a profile may name.
pub const MAX_APPLE_FAMILY: u8 = 10;
/// Threadgroup memory above this draws a warning: no shipping Mac reports more.
pub const SHIPPING_MAX_THREADGROUP_MEMORY: u64 = 32 * 1024;

/// The answers a profile changes. Only Apple families are ever raised; Common, Mac,
/// Metal3 and Metal4 answers are never touched (MLX breaks when Metal3 is claimed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// `supportsFamily:` answers YES for Apple1 ..= Apple`apple_family_max`.
    pub apple_family_max: u8,
    /// Floor for `maxThreadgroupMemoryLength`: the effective answer is the larger of this and the stock one.
    pub max_threadgroup_memory: u64,
    /// Floor for `recommendedMaxWorkingSetSize`, only when the profile sets it.
    pub recommended_working_set: Option<u64>,
}

impl Capabilities {
    /// The effective `supportsFamily:` answer given the stock one: stock OR an Apple
    /// family in 1001 ..= 1000 + `apple_family_max`. Non-Apple families pass through.
    #[must_use]
    pub fn supports_family(&self, family: i64, stock: bool) -> bool {
        stock
            || (family > APPLE_FAMILY_BASE
                && family <= APPLE_FAMILY_BASE + i64::from(self.apple_family_max))
    }

    /// The effective `maxThreadgroupMemoryLength` given the stock one.
    #[must_use]
    pub fn threadgroup_memory(&self, stock: u64) -> u64 {
        stock.max(self.max_threadgroup_memory)
    }

    /// The effective `recommendedMaxWorkingSetSize` given the stock one.
    #[must_use]
    pub fn working_set(&self, stock: u64) -> u64 {
        match self.recommended_working_set {
            Some(floor) => stock.max(floor),
            None => stock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APPLE7: Capabilities = Capabilities {
        apple_family_max: 7,
        max_threadgroup_memory: 32768,
        recommended_working_set: None,
    };

    #[test]
    fn apple_families_up_to_the_ceiling_are_raised_and_nothing_else() {
        assert!(APPLE7.supports_family(1007, false));
        assert!(APPLE7.supports_family(1001, false));
        assert!(!APPLE7.supports_family(1008, false));
        assert!(!APPLE7.supports_family(1000, false));
        // Metal3 (5001), Common3 (3003), Mac2 (2002) are never raised...
        assert!(!APPLE7.supports_family(5001, false));
        assert!(!APPLE7.supports_family(2002, false));
        // ...and never lowered.
        assert!(APPLE7.supports_family(3003, true));
    }

    #[test]
    fn threadgroup_memory_and_working_set_are_floors_not_overrides() {
        assert_eq!(APPLE7.threadgroup_memory(16384), 32768);
        assert_eq!(APPLE7.threadgroup_memory(65536), 65536);
        assert_eq!(APPLE7.working_set(123), 123);
        let with_ws = Capabilities {
            recommended_working_set: Some(1000),
            ..APPLE7
        };
        assert_eq!(with_ws.working_set(10), 1000);
        assert_eq!(with_ws.working_set(5000), 5000);
    }
}
