//! The Metal hooks: the same code on macOS and on the Linux simulation.
//!
//! 1. When `_MTLDevice` appears, `-[_MTLDevice initGPUFamilySupport]` (the only
//!    private selector metalift relies on) is replaced by [`device_init`], which
//!    calls the original and then, on the first device only, acts on the verdict.
//!    If the class has no such selector the shim cannot see devices being made:
//!    it reports `failed` at once and installs nothing.
//! 2. At the first device init the stock answers are read, the verdict is awaited
//!    (hard deadline), and for an unlock three methods of the device's *concrete*
//!    class are replaced, keeping the originals: `supportsFamily:` (original OR an
//!    Apple family up to the ceiling; other families pass through untouched),
//!    `maxThreadgroupMemoryLength` (the larger of the two) and, only when the
//!    profile sets it, `recommendedMaxWorkingSetSize`. The answers are then read
//!    again and must be exactly what the profile promises.
//! 3. A missing selector, or answers that did not change as promised, rolls back
//!    every replacement made so far (`class_replaceMethod` with the saved original;
//!    an inherited method gets an override that calls the inherited IMP, which
//!    answers exactly as before) and reports `failed`. There is never a
//!    half-installed state left behind, and never a silent no-op.
//!
//! Only the first device's class is hooked: a process (or a Mac) with two GPU
//! classes would see the second stock. The hook assumes every device class runs
//! `-[_MTLDevice initGPUFamilySupport]` while it is created (true of the
//! simulation, and what Cua's field-tested shim relies on for the real Metal); a
//! class that overrode it without calling `super` would stay stock with no
//! outcome reported — only type-checked for macOS here, to be confirmed on a Mac. Every IMP here runs inside
//! `ffi_boundary!`, whose safe value calls the original.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Once, OnceLock};

use metalift_policy::profile::Capabilities;
use metalift_policy::wire::{Answers, Outcome, OutcomeResult, KNOWN_FAMILIES};

use crate::log;
use crate::objc::{Class, Id, Imp, Runtime, Scope, Sel};
use crate::session::{self, Plan};

/// The private base class of every Metal device.
const DEVICE_CLASS: &CStr = c"_MTLDevice";
/// Its device-init selector, called once per device while it is created.
const INIT_SELECTOR: &CStr = c"initGPUFamilySupport";
const SUPPORTS_FAMILY: &CStr = c"supportsFamily:";
const THREADGROUP_MEMORY: &CStr = c"maxThreadgroupMemoryLength";
const WORKING_SET: &CStr = c"recommendedMaxWorkingSetSize";

type InitFn = unsafe extern "C" fn(Id, Sel);
type SupportsFamilyFn = unsafe extern "C" fn(Id, Sel, isize) -> u8;
type ThreadgroupFn = unsafe extern "C" fn(Id, Sel) -> usize;
type WorkingSetFn = unsafe extern "C" fn(Id, Sel) -> u64;

/// The runtime in which `_MTLDevice` was found; set once, read by the IMPs.
static RUNTIME: OnceLock<Runtime> = OnceLock::new();
/// Set by whoever first finds `_MTLDevice`: hooking is attempted once per process.
static ATTEMPTED: AtomicBool = AtomicBool::new(false);
/// The profile the capability IMPs answer with; set just before they are installed.
static CAPABILITIES: OnceLock<Capabilities> = OnceLock::new();
/// The first device init acts on the verdict; later ones only call the original.
static FIRST_DEVICE: Once = Once::new();

/// Original implementations, stored before a replacement is installed so an IMP
/// can never run without its original.
static ORIGINAL_INIT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static ORIGINAL_SUPPORTS_FAMILY: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static ORIGINAL_THREADGROUP: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static ORIGINAL_WORKING_SET: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Whether the device-init hook has been attempted (no need to look again).
pub(crate) fn attempted() -> bool {
    ATTEMPTED.load(Ordering::Acquire)
}

/// Called when an image may have brought Metal in: at load time with
/// [`Scope::Global`], after each `dlopen` with its handle, from dyld's add-image
/// callback on macOS. Cheap when there is no Objective-C runtime or no Metal.
pub(crate) fn metal_may_have_arrived(scope: Scope) {
    if attempted() {
        return;
    }
    let Some(runtime) = Runtime::resolve(scope) else {
        return;
    };
    let Some(device_class) = runtime.class(DEVICE_CLASS) else {
        return;
    };
    if ATTEMPTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let runtime = *RUNTIME.get_or_init(|| runtime);
    match hook_device_init(&runtime, device_class) {
        Ok(()) => log::debug("hooked -[_MTLDevice initGPUFamilySupport]"),
        Err(reason) => fail_without_device(&reason),
    }
}

fn hook_device_init(runtime: &Runtime, device_class: Class) -> Result<(), String> {
    let sel = runtime.sel(INIT_SELECTOR);
    let method = runtime.instance_method(device_class, sel).ok_or(
        "selector -[_MTLDevice initGPUFamilySupport] is missing: this Metal is not supported",
    )?;
    ORIGINAL_INIT.store(runtime.implementation(method), Ordering::Release);
    runtime.set_implementation(method, device_init as InitFn as Imp);
    Ok(())
}

/// Metal is here but cannot be hooked: report `failed` now, with the decision id
/// if the verdict has already arrived (the shim will never see a device init).
fn fail_without_device(reason: &str) {
    let decision_id = match session::plan_without_waiting() {
        Plan::Unlock { decision_id, .. } | Plan::Stock { decision_id, .. } => decision_id,
    };
    log::warn(&format!("failed: {reason}; the process stays stock"));
    session::report(&Outcome {
        decision_id,
        result: OutcomeResult::Failed,
        reason: reason.to_owned(),
        device_class: DEVICE_CLASS.to_string_lossy().into_owned(),
        stock: Answers::default(),
        effective: Answers::default(),
    });
}

/// Replaces `-[_MTLDevice initGPUFamilySupport]`.
unsafe extern "C" fn device_init(device: Id, cmd: Sel) {
    let original = ORIGINAL_INIT.load(Ordering::Acquire);
    if !original.is_null() {
        // SAFETY: `original` is the IMP this one replaced, with signature (id, SEL) -> void.
        let original = unsafe { std::mem::transmute::<Imp, InitFn>(original) };
        // SAFETY: called with the receiver and selector it was sent.
        unsafe { original(device, cmd) };
    }
    ffi_boundary!((), FIRST_DEVICE.call_once(|| first_device(device)))
}

/// Reads the stock answers, awaits the verdict, applies it, reports the outcome.
fn first_device(device: Id) {
    let Some(runtime) = RUNTIME.get() else {
        return;
    };
    let class = runtime.class_of(device);
    let device_class = runtime.class_name(class);
    let stock = read_answers(runtime, device);
    let (decision_id, result, reason) = match session::plan() {
        Plan::Stock {
            decision_id,
            reason,
        } => (decision_id, OutcomeResult::Stock, reason),
        Plan::Unlock {
            decision_id,
            capabilities,
            rule,
        } => match apply(runtime, device, class, capabilities, stock) {
            Ok(()) => (
                decision_id,
                OutcomeResult::Applied,
                format!("rule {}", rule.as_deref().unwrap_or("?")),
            ),
            Err(reason) => (decision_id, OutcomeResult::Failed, reason),
        },
    };
    let effective = read_answers(runtime, device);
    let families: Vec<&str> = effective.family_names().collect();
    let message = format!(
        "{} for {device_class} (decision {decision_id}): {reason}; answers {} / threadgroup memory {}",
        result.as_str(),
        families.join(","),
        effective.threadgroup_memory
    );
    match result {
        OutcomeResult::Failed => log::warn(&message),
        OutcomeResult::Applied | OutcomeResult::Stock => log::info(&message),
    }
    let reason = if result == OutcomeResult::Applied {
        String::new()
    } else {
        reason
    };
    session::report(&Outcome {
        decision_id,
        result,
        reason,
        device_class,
        stock,
        effective,
    });
}

/// One replacement made on the device class, with what it replaced.
struct Installed {
    sel: Sel,
    previous: Imp,
    types: *const c_char,
}

/// Installs the capability IMPs on `class`, or rolls everything back.
fn apply(
    runtime: &Runtime,
    device: Id,
    class: Class,
    capabilities: Capabilities,
    stock: Answers,
) -> Result<(), String> {
    if CAPABILITIES.set(capabilities).is_err() {
        return Err("capability hooks were already installed".into());
    }
    let mut replacements: Vec<(&CStr, Imp, &AtomicPtr<c_void>)> = vec![
        (
            SUPPORTS_FAMILY,
            supports_family as SupportsFamilyFn as Imp,
            &ORIGINAL_SUPPORTS_FAMILY,
        ),
        (
            THREADGROUP_MEMORY,
            max_threadgroup_memory as ThreadgroupFn as Imp,
            &ORIGINAL_THREADGROUP,
        ),
    ];
    if capabilities.recommended_working_set.is_some() {
        replacements.push((
            WORKING_SET,
            recommended_working_set as WorkingSetFn as Imp,
            &ORIGINAL_WORKING_SET,
        ));
    }
    let class_name = runtime.class_name(class);
    let mut installed: Vec<Installed> = Vec::with_capacity(replacements.len());
    for (selector, hook, original) in replacements {
        let sel = runtime.sel(selector);
        let Some(method) = runtime.instance_method(class, sel) else {
            roll_back(runtime, class, &installed);
            return Err(format!(
                "selector -[{class_name} {}] is missing; rolled back {} hook(s)",
                selector.to_string_lossy(),
                installed.len()
            ));
        };
        let previous = runtime.implementation(method);
        let types = runtime.type_encoding(method);
        original.store(previous, Ordering::Release);
        runtime.replace_method(class, sel, hook, types);
        installed.push(Installed {
            sel,
            previous,
            types,
        });
    }
    let effective = read_answers(runtime, device);
    let expected = expected_answers(&capabilities, stock);
    if effective != expected {
        roll_back(runtime, class, &installed);
        return Err(format!(
            "the hooks did not take effect (families {:#x}, expected {:#x}); rolled back",
            effective.families, expected.families
        ));
    }
    Ok(())
}

fn roll_back(runtime: &Runtime, class: Class, installed: &[Installed]) {
    for item in installed.iter().rev() {
        runtime.replace_method(class, item.sel, item.previous, item.types);
    }
}

/// What a device must answer once `capabilities` are applied over `stock`.
fn expected_answers(capabilities: &Capabilities, stock: Answers) -> Answers {
    let mut families = 0;
    for (bit, (_, family)) in KNOWN_FAMILIES.iter().enumerate() {
        let was = stock.families & (1 << bit) != 0;
        if capabilities.supports_family(*family, was) {
            families |= 1 << bit;
        }
    }
    Answers {
        families,
        threadgroup_memory: capabilities.threadgroup_memory(stock.threadgroup_memory),
        working_set: capabilities.working_set(stock.working_set),
    }
}

/// Asks `device` every question the outcome reports, through whatever IMPs are
/// installed now. A getter the class lacks reads as 0.
fn read_answers(runtime: &Runtime, device: Id) -> Answers {
    let class = runtime.class_of(device);
    let imp = |selector: &CStr| {
        let sel = runtime.sel(selector);
        runtime
            .instance_method(class, sel)
            .map(|m| (runtime.implementation(m), sel))
    };
    let mut answers = Answers::default();
    if let Some((imp, sel)) = imp(SUPPORTS_FAMILY) {
        // SAFETY: `supportsFamily:` is (id, SEL, NSInteger) -> BOOL.
        let f = unsafe { std::mem::transmute::<Imp, SupportsFamilyFn>(imp) };
        for (bit, (_, family)) in KNOWN_FAMILIES.iter().enumerate() {
            // SAFETY: calling the current IMP with its receiver, selector and argument.
            if unsafe { f(device, sel, *family as isize) } != 0 {
                answers.families |= 1 << bit;
            }
        }
    }
    if let Some((imp, sel)) = imp(THREADGROUP_MEMORY) {
        // SAFETY: `maxThreadgroupMemoryLength` is (id, SEL) -> NSUInteger.
        let f = unsafe { std::mem::transmute::<Imp, ThreadgroupFn>(imp) };
        // SAFETY: calling the current IMP with its receiver and selector.
        answers.threadgroup_memory = unsafe { f(device, sel) } as u64;
    }
    if let Some((imp, sel)) = imp(WORKING_SET) {
        // SAFETY: `recommendedMaxWorkingSetSize` is (id, SEL) -> uint64_t.
        let f = unsafe { std::mem::transmute::<Imp, WorkingSetFn>(imp) };
        // SAFETY: calling the current IMP with its receiver and selector.
        answers.working_set = unsafe { f(device, sel) };
    }
    answers
}

fn original<F: Copy>(slot: &AtomicPtr<c_void>) -> Option<F> {
    let imp = slot.load(Ordering::Acquire);
    if imp.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<Imp>());
    // SAFETY: each slot only ever holds the IMP of the selector whose function type
    // the caller names (see `apply`), and F is a function pointer type.
    Some(unsafe { std::mem::transmute_copy::<Imp, F>(&imp) })
}

/// Replaces `supportsFamily:` on the device class.
unsafe extern "C" fn supports_family(device: Id, cmd: Sel, family: isize) -> u8 {
    let Some(original) = original::<SupportsFamilyFn>(&ORIGINAL_SUPPORTS_FAMILY) else {
        return 0;
    };
    // SAFETY: calling the original IMP with the receiver, selector and argument we were sent.
    let call_original = || unsafe { original(device, cmd, family) };
    ffi_boundary!(call_original(), {
        let stock = call_original() != 0;
        let answer = match CAPABILITIES.get() {
            Some(caps) => caps.supports_family(family as i64, stock),
            None => stock,
        };
        u8::from(answer)
    })
}

/// Replaces `maxThreadgroupMemoryLength` on the device class.
unsafe extern "C" fn max_threadgroup_memory(device: Id, cmd: Sel) -> usize {
    let Some(original) = original::<ThreadgroupFn>(&ORIGINAL_THREADGROUP) else {
        return 0;
    };
    // SAFETY: calling the original IMP with the receiver and selector we were sent.
    let call_original = || unsafe { original(device, cmd) };
    ffi_boundary!(call_original(), {
        let stock = call_original() as u64;
        let answer = CAPABILITIES
            .get()
            .map_or(stock, |caps| caps.threadgroup_memory(stock));
        usize::try_from(answer).unwrap_or(usize::MAX)
    })
}

/// Replaces `recommendedMaxWorkingSetSize` on the device class (only when the
/// profile sets a floor).
unsafe extern "C" fn recommended_working_set(device: Id, cmd: Sel) -> u64 {
    let Some(original) = original::<WorkingSetFn>(&ORIGINAL_WORKING_SET) else {
        return 0;
    };
    // SAFETY: calling the original IMP with the receiver and selector we were sent.
    let call_original = || unsafe { original(device, cmd) };
    ffi_boundary!(call_original(), {
        let stock = call_original();
        CAPABILITIES
            .get()
            .map_or(stock, |caps| caps.working_set(stock))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apple7_profile_raises_apple_families_and_leaves_metal3_common_and_mac_alone() {
        let names = |a: Answers| a.family_names().collect::<Vec<_>>().join(",");
        let paravirt = Answers {
            // Apple1..5, Mac2, Common1..3 in KNOWN_FAMILIES bit order.
            families: 0b0011_1100_0001_1111,
            threadgroup_memory: 32768,
            working_set: 100,
        };
        let caps = Capabilities {
            apple_family_max: 7,
            max_threadgroup_memory: 65536,
            recommended_working_set: None,
        };
        let expected = expected_answers(&caps, paravirt);
        assert_eq!(
            names(expected),
            "Apple1,Apple2,Apple3,Apple4,Apple5,Apple6,Apple7,Mac2,Common1,Common2,Common3"
        );
        assert_eq!(expected.threadgroup_memory, 65536);
        assert_eq!(expected.working_set, 100);
    }
}
