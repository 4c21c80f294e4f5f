//! What a Metal device answers, and what llama.cpp concludes from it.
#![forbid(unsafe_code)]

use metalift_policy::wire::KNOWN_FAMILIES;

/// The questions the probe asks a device. Implemented by the simulated Metal on
/// Linux and by the real `MTLDevice` on macOS.
pub trait Device {
    /// `[device name]`.
    fn name(&self) -> String;
    /// `[device supportsFamily:family]`.
    fn supports_family(&self, family: i64) -> bool;
    /// `[device maxThreadgroupMemoryLength]`.
    fn max_threadgroup_memory(&self) -> u64;
    /// `[device recommendedMaxWorkingSetSize]`, or `None` when the device does not
    /// respond to it.
    fn recommended_working_set(&self) -> Option<u64>;
    /// `[device requiresBFloat16Emulation]` (Metal's own derived answer, SPI:
    /// `!supportsFamily:Apple9`), `None` when the device does not respond to it.
    fn requires_bf16_emulation(&self) -> Option<bool> {
        None
    }
    /// The device object's class (`AppleParavirtDevice` in a guest, a chip's
    /// driver class on a Mac), `None` when it cannot be read here.
    fn class_name(&self) -> Option<String> {
        None
    }
    /// Every capability method defined in the device's class chain, with the
    /// image its implementation lives in (`None`: cannot tell here).
    fn capability_imps(&self) -> Option<Vec<CapabilityImp>> {
        None
    }
}

/// One capability method as the device's classes define it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityImp {
    /// The class whose own method list holds it, e.g. `_MTLDevice`.
    pub class: String,
    /// The selector, e.g. `supportsFamily:`.
    pub selector: String,
    /// The file name of the image its IMP lies in, e.g. `libsimmetal.so`.
    pub image: String,
}

impl CapabilityImp {
    /// Whether the implementation is the shim's.
    pub fn is_shims(&self) -> bool {
        self.image.starts_with("libmetalift")
    }
}

/// The three capability flags llama.cpp's Metal backend derives, exactly as
/// `ggml-metal-device.m` derives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaFlags {
    /// `supportsFamily(Apple7) || supportsFamily(Metal3)`: without it MUL_MAT,
    /// norms, softmax and flash attention fall back to the CPU.
    pub has_simdgroup_reduction: bool,
    /// `supportsFamily(Apple7)`.
    pub has_simdgroup_mm: bool,
    /// `supportsFamily(Metal3) || supportsFamily(Apple6)`.
    pub has_bfloat: bool,
}

/// `MTLGPUFamilyApple6`, `Apple7`, `Metal3`.
const APPLE6: i64 = 1006;
const APPLE7: i64 = 1007;
const METAL3: i64 = 5001;

impl LlamaFlags {
    /// Derives the flags from `supports_family`, asking only what llama.cpp asks.
    pub fn derive(supports_family: impl Fn(i64) -> bool) -> LlamaFlags {
        LlamaFlags {
            has_simdgroup_reduction: supports_family(APPLE7) || supports_family(METAL3),
            has_simdgroup_mm: supports_family(APPLE7),
            has_bfloat: supports_family(METAL3) || supports_family(APPLE6),
        }
    }
}

/// Everything the probe learned from one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The device's name.
    pub name: String,
    /// The device object's class (see [`Device::class_name`]).
    pub class: Option<String>,
    /// `(family name, answer)` for every family in [`KNOWN_FAMILIES`] order.
    pub families: Vec<(&'static str, bool)>,
    /// `maxThreadgroupMemoryLength`.
    pub max_threadgroup_memory: u64,
    /// `recommendedMaxWorkingSetSize`, if the device answers it.
    pub recommended_working_set: Option<u64>,
    /// What llama.cpp would conclude.
    pub llama: LlamaFlags,
    /// Metal's own bf16-emulation answer (see [`Device::requires_bf16_emulation`]).
    pub requires_bf16_emulation: Option<bool>,
    /// The capability methods and where they live (see [`Device::capability_imps`]).
    pub capability_imps: Option<Vec<CapabilityImp>>,
    /// How long creating the device took (`MTLCreateSystemDefaultDevice`), when
    /// the caller timed it: with the shim, the first device's check-in is in it.
    pub device_creation: Option<std::time::Duration>,
    /// `--threads N`: how long each concurrent creation took, shortest first
    /// (Metal's registration lock makes the later ones wait for the first).
    pub concurrent_creations: Vec<std::time::Duration>,
}

impl Report {
    /// Asks `device` every question.
    pub fn probe(device: &dyn Device) -> Report {
        Report {
            name: device.name(),
            class: device.class_name(),
            families: KNOWN_FAMILIES
                .iter()
                .map(|&(name, value)| (name, device.supports_family(value)))
                .collect(),
            max_threadgroup_memory: device.max_threadgroup_memory(),
            recommended_working_set: device.recommended_working_set(),
            llama: LlamaFlags::derive(|f| device.supports_family(f)),
            requires_bf16_emulation: device.requires_bf16_emulation(),
            capability_imps: device.capability_imps(),
            device_creation: None,
            concurrent_creations: Vec::new(),
        }
    }

    /// The same report, with the times of `--threads N`'s concurrent creations.
    #[must_use]
    pub fn with_concurrent_creations(mut self, mut took: Vec<std::time::Duration>) -> Report {
        took.sort();
        self.concurrent_creations = took;
        self
    }

    /// The same report, saying how long the device's creation took.
    #[must_use]
    pub fn with_device_creation(mut self, took: std::time::Duration) -> Report {
        self.device_creation = Some(took);
        self
    }

    /// How many capability methods have the shim's implementation (`None`:
    /// cannot tell here). After a roll-back or a stock outcome it must be 0.
    pub fn shim_imps(&self) -> Option<usize> {
        self.capability_imps
            .as_ref()
            .map(|imps| imps.iter().filter(|imp| imp.is_shims()).count())
    }

    /// The answer recorded for `family` (a name from [`KNOWN_FAMILIES`]).
    pub fn supports(&self, family: &str) -> Option<bool> {
        self.families
            .iter()
            .find(|(name, _)| *name == family)
            .map(|(_, yes)| *yes)
    }

    /// The highest Apple family answered YES, e.g. `Some(5)` for Apple5.
    pub fn apple_family(&self) -> Option<u8> {
        (1..=10u8)
            .rev()
            .find(|n| self.supports(&format!("Apple{n}")) == Some(true))
    }

    /// Whether the device's Apple family answers meet `expected`
    /// (`metalift-probe --expect-family N` or `=N`).
    pub fn meets(&self, expected: metalift_policy::FamilyExpectation) -> bool {
        expected.holds(|n| self.supports(&format!("Apple{n}")) == Some(true))
    }

    /// The human-readable table.
    pub fn to_text(&self) -> String {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let mut out = format!("device: {}\n", self.name);
        for (name, yes) in &self.families {
            out.push_str(&format!("  {name:<8} {}\n", yes_no(*yes)));
        }
        out.push_str(&format!(
            "maxThreadgroupMemoryLength: {}\n",
            self.max_threadgroup_memory
        ));
        match self.recommended_working_set {
            Some(ws) => out.push_str(&format!("recommendedMaxWorkingSetSize: {ws}\n")),
            None => out.push_str("recommendedMaxWorkingSetSize: (not answered)\n"),
        }
        out.push_str(&format!(
            "llama.cpp: has_simdgroup_reduction={} has_simdgroup_mm={} has_bfloat={}\n",
            self.llama.has_simdgroup_reduction, self.llama.has_simdgroup_mm, self.llama.has_bfloat
        ));
        out
    }

    /// One JSON document (keys stable; tests and `metalift demo` read it).
    pub fn to_json(&self) -> serde_json::Value {
        let families: serde_json::Map<String, serde_json::Value> = self
            .families
            .iter()
            .map(|(name, yes)| ((*name).to_owned(), serde_json::Value::Bool(*yes)))
            .collect();
        serde_json::json!({
            "name": self.name,
            "class": self.class,
            "families": families,
            "apple_family": self.apple_family(),
            "max_threadgroup_memory": self.max_threadgroup_memory,
            "recommended_working_set": self.recommended_working_set,
            "shim_imps": self.shim_imps(),
            "requires_bf16_emulation": self.requires_bf16_emulation,
            "device_creation_us": self.device_creation.map(|d| d.as_secs_f64() * 1e6),
            "concurrent_creations_us": self
                .concurrent_creations
                .iter()
                .map(|d| d.as_secs_f64() * 1e6)
                .collect::<Vec<_>>(),
            "capability_imps": self.capability_imps.as_ref().map(|imps| {
                imps.iter()
                    .map(|imp| {
                        (
                            format!("-[{} {}]", imp.class, imp.selector),
                            serde_json::Value::String(imp.image.clone()),
                        )
                    })
                    .collect::<serde_json::Map<_, _>>()
            }),
            "llama_cpp": {
                "has_simdgroup_reduction": self.llama.has_simdgroup_reduction,
                "has_simdgroup_mm": self.llama.has_simdgroup_mm,
                "has_bfloat": self.llama.has_bfloat,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(&'static [i64]);

    impl Device for Fake {
        fn name(&self) -> String {
            "fake".into()
        }
        fn supports_family(&self, family: i64) -> bool {
            self.0.contains(&family)
        }
        fn max_threadgroup_memory(&self) -> u64 {
            32768
        }
        fn recommended_working_set(&self) -> Option<u64> {
            None
        }
    }

    #[test]
    fn the_paravirtual_answers_leave_every_llama_flag_off() {
        let report = Report::probe(&Fake(&[1001, 1002, 1003, 1004, 1005, 2002, 3003]));
        assert_eq!(report.apple_family(), Some(5));
        assert_eq!(
            report.llama,
            LlamaFlags {
                has_simdgroup_reduction: false,
                has_simdgroup_mm: false,
                has_bfloat: false
            }
        );
    }

    #[test]
    fn apple7_without_metal3_turns_every_llama_flag_on() {
        let report = Report::probe(&Fake(&[1005, 1006, 1007]));
        assert!(report.llama.has_simdgroup_reduction);
        assert!(report.llama.has_simdgroup_mm);
        assert!(report.llama.has_bfloat);
        assert_eq!(report.supports("Metal3"), Some(false));
    }

    #[test]
    fn metal3_alone_gives_reduction_and_bfloat_but_not_simdgroup_mm() {
        let flags = LlamaFlags::derive(|f| f == METAL3);
        assert!(flags.has_simdgroup_reduction);
        assert!(!flags.has_simdgroup_mm);
        assert!(flags.has_bfloat);
    }

    #[test]
    fn json_names_every_known_family() {
        let json = Report::probe(&Fake(&[1005])).to_json();
        for (name, _) in KNOWN_FAMILIES {
            assert!(json["families"][name].is_boolean(), "{name}");
        }
        assert_eq!(json["apple_family"], 5);
        assert!(json["recommended_working_set"].is_null());
    }
}
