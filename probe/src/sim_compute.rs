//! The compute path of the simulated Metal (Linux): a [`Job`] compiled, run and
//! read back through `probe/simmetal/compute.m`, sending the messages the real
//! Metal is sent (`crate::macos_compute`), in the same order.
//!
//! The simulation takes and returns C strings where Metal has NSString (no
//! Foundation on the GCC runtime); everything else has Metal's shape.

use std::ffi::{c_char, c_void, CStr, CString};

use crate::sim::SimDevice;
use crate::verify::{Compute, Failure, Job};

type Id = *mut c_void;
type Sel = *const c_void;
type Imp = unsafe extern "C" fn();
type MsgLookupFn = unsafe extern "C" fn(Id, Sel) -> Option<Imp>;
type SelRegisterNameFn = unsafe extern "C" fn(*const c_char) -> Sel;

/// `MTLSize`, passed by value as Metal passes it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MtlSize {
    width: u64,
    height: u64,
    depth: u64,
}

/// `MTLCommandBufferStatusCompleted`.
const STATUS_COMPLETED: u64 = 4;

/// The simulated device, as a GPU that runs jobs.
#[derive(Debug)]
pub struct SimCompute<'a> {
    device: &'a SimDevice,
    msg_lookup: MsgLookupFn,
    sel_register_name: SelRegisterNameFn,
}

impl<'a> SimCompute<'a> {
    /// The compute path of `device` (the runtime looked up globally: the linked probe).
    pub fn new(device: &'a SimDevice) -> Result<SimCompute<'a>, String> {
        let lookup = |name: &CStr| {
            // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
            let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            if sym.is_null() {
                Err(format!("symbol {} not found", name.to_string_lossy()))
            } else {
                Ok(sym)
            }
        };
        let msg_lookup = lookup(c"objc_msg_lookup")?;
        let sel_register_name = lookup(c"sel_registerName")?;
        Ok(SimCompute {
            device,
            // SAFETY: objc_msg_lookup has this signature in GCC's <objc/message.h>.
            msg_lookup: unsafe { std::mem::transmute::<*mut c_void, MsgLookupFn>(msg_lookup) },
            // SAFETY: sel_registerName has this signature in GCC's <objc/runtime.h>.
            sel_register_name: unsafe {
                std::mem::transmute::<*mut c_void, SelRegisterNameFn>(sel_register_name)
            },
        })
    }

    /// The implementation `receiver` runs for `selector`.
    fn imp(&self, receiver: Id, selector: &CStr) -> Result<(Imp, Sel), String> {
        if receiver.is_null() {
            return Err(format!("{} sent to nil", selector.to_string_lossy()));
        }
        // SAFETY: a NUL-terminated selector name; the runtime copies it.
        let sel = unsafe { (self.sel_register_name)(selector.as_ptr()) };
        // SAFETY: `receiver` is a live object of the simulated Metal.
        let imp = unsafe { (self.msg_lookup)(receiver, sel) }
            .ok_or_else(|| format!("no {}", selector.to_string_lossy()))?;
        Ok((imp, sel))
    }

    /// `[receiver selector]` returning an object (or any pointer-sized value).
    fn send_id(&self, receiver: Id, selector: &CStr) -> Result<Id, String> {
        let (imp, sel) = self.imp(receiver, selector)?;
        // SAFETY: every selector sent through here takes no arguments and returns
        // an object pointer (or `void *`) in compute.m.
        let f = unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel) -> Id>(imp) };
        // SAFETY: calling the IMP with its receiver and selector.
        Ok(unsafe { f(receiver, sel) })
    }

    /// `[receiver selector]` returning nothing or an NSUInteger.
    fn send_u64(&self, receiver: Id, selector: &CStr) -> Result<u64, String> {
        let (imp, sel) = self.imp(receiver, selector)?;
        // SAFETY: the selectors sent through here return NSUInteger or void (the
        // value is then ignored) and take no arguments.
        let f = unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel) -> u64>(imp) };
        // SAFETY: calling the IMP with its receiver and selector.
        Ok(unsafe { f(receiver, sel) })
    }

    /// An error object's `localizedDescription`.
    fn describe(&self, error: Id) -> String {
        let Ok(text) = self.send_id(error, c"localizedDescription") else {
            return "no error description".into();
        };
        if text.is_null() {
            return "no error description".into();
        }
        // SAFETY: SimError's -localizedDescription returns its NUL-terminated buffer.
        unsafe { CStr::from_ptr(text.cast::<c_char>()) }
            .to_string_lossy()
            .into_owned()
    }

    fn compile(&self, job: &Job) -> Result<Id, String> {
        let device = self.device.object();
        let source = CString::new(job.source).map_err(|_| "source contains NUL".to_owned())?;
        let (imp, sel) = self.imp(device, c"newLibraryWithSource:options:error:")?;
        // SAFETY: `-(id)newLibraryWithSource:(const char *)options:(id)error:(id *)` in compute.m.
        let f = unsafe {
            std::mem::transmute::<
                Imp,
                unsafe extern "C" fn(Id, Sel, *const c_char, Id, *mut Id) -> Id,
            >(imp)
        };
        let mut error: Id = std::ptr::null_mut();
        // SAFETY: the source outlives the call; `error` is a valid out-pointer.
        let library = unsafe {
            f(
                device,
                sel,
                source.as_ptr(),
                std::ptr::null_mut(),
                &mut error,
            )
        };
        if library.is_null() {
            return Err(self.describe(error));
        }
        let name = CString::new(job.function).map_err(|_| "name contains NUL".to_owned())?;
        let (imp, sel) = self.imp(library, c"newFunctionWithName:")?;
        // SAFETY: `-(id)newFunctionWithName:(const char *)` in compute.m.
        let f = unsafe {
            std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, *const c_char) -> Id>(imp)
        };
        // SAFETY: `name` outlives the call.
        let function = unsafe { f(library, sel, name.as_ptr()) };
        if function.is_null() {
            return Err(format!("no function {} in the library", job.function));
        }
        let (imp, sel) = self.imp(device, c"newComputePipelineStateWithFunction:error:")?;
        // SAFETY: `-(id)newComputePipelineStateWithFunction:(id)error:(id *)` in compute.m.
        let f = unsafe {
            std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, Id, *mut Id) -> Id>(imp)
        };
        let mut error: Id = std::ptr::null_mut();
        // SAFETY: `function` is live; `error` is a valid out-pointer.
        let pipeline = unsafe { f(device, sel, function, &mut error) };
        if pipeline.is_null() {
            return Err(self.describe(error));
        }
        Ok(pipeline)
    }

    fn buffer(&self, bytes: &[u8]) -> Result<Id, String> {
        let device = self.device.object();
        let (imp, sel) = self.imp(device, c"newBufferWithLength:options:")?;
        // SAFETY: `-(id)newBufferWithLength:(NSUInteger)options:(NSUInteger)` in compute.m.
        let f = unsafe {
            std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, u64, u64) -> Id>(imp)
        };
        // SAFETY: plain integers; MTLResourceStorageModeShared is 0.
        let buffer = unsafe { f(device, sel, bytes.len() as u64, 0) };
        if buffer.is_null() {
            return Err(format!("no buffer of {} bytes", bytes.len()));
        }
        let contents = self.send_id(buffer, c"contents")?;
        // SAFETY: -contents points at the buffer's `bytes.len()` bytes, which nothing
        // else touches until the command buffer runs.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), contents.cast::<u8>(), bytes.len())
        };
        Ok(buffer)
    }

    fn encode_and_run(&self, job: &Job, pipeline: Id, buffers: &[Id]) -> Result<(), String> {
        let queue = self.send_id(self.device.object(), c"newCommandQueue")?;
        let command_buffer = self.send_id(queue, c"commandBuffer")?;
        let encoder = self.send_id(command_buffer, c"computeCommandEncoder")?;
        let (imp, sel) = self.imp(encoder, c"setComputePipelineState:")?;
        // SAFETY: `-(void)setComputePipelineState:(id)`.
        let f = unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, Id)>(imp) };
        // SAFETY: live encoder and pipeline.
        unsafe { f(encoder, sel, pipeline) };
        let (imp, sel) = self.imp(encoder, c"setBuffer:offset:atIndex:")?;
        // SAFETY: `-(void)setBuffer:(id)offset:(NSUInteger)atIndex:(NSUInteger)`.
        let f =
            unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, Id, u64, u64)>(imp) };
        for (index, &buffer) in buffers.iter().enumerate() {
            // SAFETY: live encoder and buffer.
            unsafe { f(encoder, sel, buffer, 0, index as u64) };
        }
        if job.threadgroup_memory > 0 {
            let (imp, sel) = self.imp(encoder, c"setThreadgroupMemoryLength:atIndex:")?;
            // SAFETY: `-(void)setThreadgroupMemoryLength:(NSUInteger)atIndex:(NSUInteger)`.
            let f =
                unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, u64, u64)>(imp) };
            // SAFETY: plain integers.
            unsafe { f(encoder, sel, job.threadgroup_memory, 0) };
        }
        let (imp, sel) = self.imp(encoder, c"dispatchThreadgroups:threadsPerThreadgroup:")?;
        // SAFETY: `-(void)dispatchThreadgroups:(MTLSize)threadsPerThreadgroup:(MTLSize)`,
        // MTLSize passed by value as a C struct of three NSUIntegers.
        let f = unsafe {
            std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, MtlSize, MtlSize)>(imp)
        };
        let one = MtlSize {
            width: 1,
            height: 1,
            depth: 1,
        };
        let threads = MtlSize {
            width: job.threads,
            ..one
        };
        // SAFETY: live encoder; sizes by value.
        unsafe { f(encoder, sel, one, threads) };
        self.send_u64(encoder, c"endEncoding")?;
        self.send_u64(command_buffer, c"commit")?;
        self.send_u64(command_buffer, c"waitUntilCompleted")?;
        if self.send_u64(command_buffer, c"status")? != STATUS_COMPLETED {
            let error = self.send_id(command_buffer, c"error")?;
            return Err(self.describe(error));
        }
        Ok(())
    }
}

impl Compute for SimCompute<'_> {
    fn run(&self, job: &Job) -> Result<Vec<u8>, Failure> {
        let pipeline = self.compile(job).map_err(Failure::Compile)?;
        let buffers = job
            .buffers
            .iter()
            .map(|b| self.buffer(b))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failure::Run)?;
        self.encode_and_run(job, pipeline, &buffers)
            .map_err(Failure::Run)?;
        let output = *buffers
            .get(job.output)
            .ok_or_else(|| Failure::Run("no output buffer".into()))?;
        let len = job.buffers.get(job.output).map_or(0, Vec::len);
        let contents = self.send_id(output, c"contents").map_err(Failure::Run)?;
        let mut out = vec![0u8; len];
        // SAFETY: the command buffer completed; -contents points at `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(contents.cast::<u8>(), out.as_mut_ptr(), len) };
        Ok(out)
    }
}
