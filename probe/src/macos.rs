//! The real Metal (macOS), through `objc2-metal`: the same messages llama.cpp sends.

use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_metal::{MTLDevice, MTLGPUFamily};

use crate::report::Device;

/// The system's default Metal device.
#[derive(Debug)]
pub struct MetalDevice(Retained<ProtocolObject<dyn MTLDevice>>);

/// `MTLCreateSystemDefaultDevice()`, as llama.cpp calls it.
pub fn default_device() -> Result<MetalDevice, String> {
    objc2_metal::MTLCreateSystemDefaultDevice()
        .map(MetalDevice)
        .ok_or_else(|| "MTLCreateSystemDefaultDevice returned nil".into())
}

/// Loads Metal with `dlopen` from `path` (as Python loads PyTorch's MPS backend)
/// and creates its default device through the symbol found there.
pub fn open(path: &str) -> Result<MetalDevice, String> {
    use std::ffi::{c_void, CString};

    let c_path = CString::new(path).map_err(|_| format!("{path}: contains NUL"))?;
    // SAFETY: `c_path` is a C string; loading Metal runs its initialisers, which is the point.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("dlopen {path} failed"));
    }
    // SAFETY: `handle` is live; the name is a C string.
    let create = unsafe { libc::dlsym(handle, c"MTLCreateSystemDefaultDevice".as_ptr()) };
    if create.is_null() {
        return Err(format!("{path}: no MTLCreateSystemDefaultDevice"));
    }
    // SAFETY: Metal declares `id<MTLDevice> MTLCreateSystemDefaultDevice(void)` (returns +1).
    let create = unsafe {
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn() -> *mut ProtocolObject<dyn MTLDevice>,
        >(create)
    };
    // SAFETY: calling Metal's entry point; it has no preconditions.
    let raw = unsafe { create() };
    // SAFETY: the returned object is +1 retained (a "Create" function), so we take ownership.
    unsafe { Retained::from_raw(raw) }
        .map(MetalDevice)
        .ok_or_else(|| "MTLCreateSystemDefaultDevice returned nil".into())
}

impl MetalDevice {
    /// The `MTLDevice` itself, for the compute path (`crate::macos_compute`).
    pub(crate) fn device(&self) -> &ProtocolObject<dyn MTLDevice> {
        &self.0
    }
}

impl Device for MetalDevice {
    fn name(&self) -> String {
        self.0.name().to_string()
    }

    fn class_name(&self) -> Option<String> {
        let object: &objc2::runtime::AnyObject = self.0.as_ref();
        Some(object.class().name().to_string_lossy().into_owned())
    }

    fn supports_family(&self, family: i64) -> bool {
        self.0.supportsFamily(MTLGPUFamily(family as _))
    }

    fn max_threadgroup_memory(&self) -> u64 {
        self.0.maxThreadgroupMemoryLength() as u64
    }

    fn recommended_working_set(&self) -> Option<u64> {
        Some(self.0.recommendedMaxWorkingSetSize())
    }

    fn requires_bf16_emulation(&self) -> Option<bool> {
        use objc2::runtime::{AnyObject, Bool};
        use objc2::{msg_send, sel};
        let object: &AnyObject = self.0.as_ref();
        if !object.class().responds_to(sel!(requiresBFloat16Emulation)) {
            return None;
        }
        // SAFETY: the device responds to the SPI `-(BOOL)requiresBFloat16Emulation`
        // (REAL-METAL.md 4), which takes no arguments.
        let answer: Bool = unsafe { msg_send![object, requiresBFloat16Emulation] };
        Some(answer.as_bool())
    }
}
