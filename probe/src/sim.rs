//! The simulated Metal (Linux): a device from `libsimmetal.so`, asked its
//! questions through the GCC Objective-C runtime the way compiled Objective-C asks
//! (`objc_msg_lookup`, then a call of the returned implementation).
//!
//! The runtime's functions are looked up with `dlsym` in the scope the device's
//! library was loaded into, so the same code serves the linked probe and the one
//! that `dlopen`s the library with `RTLD_LOCAL`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use crate::report::{CapabilityImp, Device};

type Id = *mut c_void;
type Class = *mut c_void;
type Sel = *const c_void;
type Imp = unsafe extern "C" fn();

/// Where to look up symbols: everything loaded globally, or one `dlopen` handle
/// (which covers that library and its dependencies).
#[derive(Debug, Clone, Copy)]
pub enum Scope {
    /// `RTLD_DEFAULT`.
    Global,
    /// A handle returned by `dlopen`.
    Library(*mut c_void),
}

impl Scope {
    fn handle(self) -> *mut c_void {
        match self {
            Scope::Global => libc::RTLD_DEFAULT,
            Scope::Library(handle) => handle,
        }
    }

    fn lookup(self, name: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: the handle is RTLD_DEFAULT or a live dlopen handle; `name` is a C string.
        let sym = unsafe { libc::dlsym(self.handle(), name.as_ptr()) };
        if sym.is_null() {
            Err(format!("symbol {} not found", name.to_string_lossy()))
        } else {
            Ok(sym)
        }
    }
}

/// The GCC runtime functions the probe needs.
#[derive(Debug, Clone, Copy)]
struct Runtime {
    msg_lookup: MsgLookupFn,
    sel_register_name: SelRegisterNameFn,
    class_responds_to_selector: RespondsFn,
    /// For [`Device::capability_imps`]; `None` if the runtime lacks one of them.
    inspect: Option<Inspect>,
}

/// The runtime functions that read a class's methods.
#[derive(Debug, Clone, Copy)]
struct Inspect {
    class_get_superclass: unsafe extern "C" fn(Class) -> Class,
    class_get_name: unsafe extern "C" fn(Class) -> *const c_char,
    class_get_instance_method: unsafe extern "C" fn(Class, Sel) -> *mut c_void,
    method_get_implementation: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
}

impl Inspect {
    fn resolve(scope: Scope) -> Option<Inspect> {
        let superclass = scope.lookup(c"class_getSuperclass").ok()?;
        let name = scope.lookup(c"class_getName").ok()?;
        let method = scope.lookup(c"class_getInstanceMethod").ok()?;
        let imp = scope.lookup(c"method_getImplementation").ok()?;
        Some(Inspect {
            // SAFETY: class_getSuperclass has this signature in GCC's <objc/runtime.h>.
            class_get_superclass: unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Class) -> Class>(superclass)
            },
            // SAFETY: class_getName has this signature in GCC's <objc/runtime.h>.
            class_get_name: unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Class) -> *const c_char>(
                    name,
                )
            },
            // SAFETY: class_getInstanceMethod has this signature (Method is a pointer).
            class_get_instance_method: unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Class, Sel) -> *mut c_void>(
                    method,
                )
            },
            // SAFETY: method_getImplementation has this signature (IMP as an address).
            method_get_implementation: unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> *mut c_void>(
                    imp,
                )
            },
        })
    }
}

type MsgLookupFn = unsafe extern "C" fn(Id, Sel) -> Option<Imp>;
type SelRegisterNameFn = unsafe extern "C" fn(*const c_char) -> Sel;
type RespondsFn = unsafe extern "C" fn(Class, Sel) -> u8;

impl Runtime {
    fn resolve(scope: Scope) -> Result<Runtime, String> {
        let msg_lookup = scope.lookup(c"objc_msg_lookup")?;
        let sel_register_name = scope.lookup(c"sel_registerName")?;
        let responds = scope.lookup(c"class_respondsToSelector")?;
        Ok(Runtime {
            // SAFETY: objc_msg_lookup has this signature in GCC's <objc/message.h>.
            msg_lookup: unsafe { std::mem::transmute::<*mut c_void, MsgLookupFn>(msg_lookup) },
            // SAFETY: sel_registerName has this signature in GCC's <objc/runtime.h>.
            sel_register_name: unsafe {
                std::mem::transmute::<*mut c_void, SelRegisterNameFn>(sel_register_name)
            },
            // SAFETY: class_respondsToSelector has this signature in <objc/runtime.h> (BOOL is unsigned char).
            class_responds_to_selector: unsafe {
                std::mem::transmute::<*mut c_void, RespondsFn>(responds)
            },
            inspect: Inspect::resolve(scope),
        })
    }

    fn sel(&self, name: &CStr) -> Sel {
        // SAFETY: `name` is a NUL-terminated selector name; the runtime copies it.
        unsafe { (self.sel_register_name)(name.as_ptr()) }
    }
}

/// A simulated `MTLDevice`.
#[derive(Debug)]
pub struct SimDevice {
    object: Id,
    runtime: Runtime,
}

/// Creates the default device with `create` (the library's
/// `MTLCreateSystemDefaultDevice`), resolving the runtime in `scope`.
///
/// # Safety
///
/// `create` must be `MTLCreateSystemDefaultDevice` from a simulated Metal library
/// loaded in `scope` (it returns a live `_MTLDevice` instance or nil).
pub unsafe fn default_device(
    create: unsafe extern "C" fn() -> Id,
    scope: Scope,
) -> Result<SimDevice, String> {
    let runtime = Runtime::resolve(scope)?;
    // SAFETY: the caller promises `create` is MTLCreateSystemDefaultDevice.
    let object = unsafe { create() };
    if object.is_null() {
        return Err("MTLCreateSystemDefaultDevice returned nil".into());
    }
    Ok(SimDevice { object, runtime })
}

/// Loads the simulated Metal at `path` with `dlopen(RTLD_NOW | RTLD_LOCAL)` (as
/// Python loads an extension) and creates its default device.
pub fn open(path: &str) -> Result<SimDevice, String> {
    let c_path = CString::new(path).map_err(|_| format!("{path}: contains NUL"))?;
    let flags: c_int = libc::RTLD_NOW | libc::RTLD_LOCAL;
    // SAFETY: `c_path` is a C string; loading runs the library's constructors, which is the point.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), flags) };
    if handle.is_null() {
        return Err(format!("dlopen {path}: {}", last_dl_error()));
    }
    let scope = Scope::Library(handle);
    let create = scope.lookup(c"MTLCreateSystemDefaultDevice")?;
    // SAFETY: the symbol is the simulated Metal's `id MTLCreateSystemDefaultDevice(void)`.
    let create =
        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> Id>(create) };
    // SAFETY: `create` came from the library just loaded into `scope`.
    unsafe { default_device(create, scope) }
}

fn last_dl_error() -> String {
    // SAFETY: dlerror takes no arguments and returns NULL or a C string valid until the next dl call.
    let err = unsafe { libc::dlerror() };
    if err.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-NULL dlerror results are NUL-terminated strings.
    unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned()
}

impl SimDevice {
    /// The device object, for the compute path (`crate::sim_compute`).
    pub(crate) fn object(&self) -> *mut c_void {
        self.object
    }

    fn imp(&self, selector: &CStr) -> Option<(Imp, Sel)> {
        let sel = self.runtime.sel(selector);
        // SAFETY: `object` is a live instance; GCC's runtime returns the IMP (or a forwarder).
        let imp = unsafe { (self.runtime.msg_lookup)(self.object, sel) }?;
        Some((imp, sel))
    }

    fn responds_to(&self, selector: &CStr) -> bool {
        let sel = self.runtime.sel(selector);
        // SAFETY: GCC's `struct objc_object` starts with its class pointer (<objc/objc.h>);
        // `object` is a live instance, so reading the first word reads its class.
        let class = unsafe { *(self.object as *const Class) };
        // SAFETY: `class` is the instance's class, `sel` a registered selector.
        unsafe { (self.runtime.class_responds_to_selector)(class, sel) != 0 }
    }

    fn call_u64(&self, selector: &CStr) -> Option<u64> {
        let (imp, sel) = self.imp(selector)?;
        // SAFETY: the getters called through here return NSUInteger / uint64_t and take no arguments.
        let f = unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel) -> u64>(imp) };
        // SAFETY: calling the IMP with its receiver and selector, as objc_msg_lookup's contract says.
        Some(unsafe { f(self.object, sel) })
    }
}

impl Device for SimDevice {
    fn name(&self) -> String {
        let Some((imp, sel)) = self.imp(c"name") else {
            return String::new();
        };
        // SAFETY: the simulated `-name` returns `const char *` and takes no arguments.
        let f = unsafe {
            std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel) -> *const c_char>(imp)
        };
        // SAFETY: calling the IMP with its receiver and selector.
        let name = unsafe { f(self.object, sel) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: the simulated device returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    fn supports_family(&self, family: i64) -> bool {
        let Some((imp, sel)) = self.imp(c"supportsFamily:") else {
            return false;
        };
        // SAFETY: `-supportsFamily:(NSInteger)` returns BOOL (unsigned char on the GCC runtime).
        let f =
            unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel, i64) -> u8>(imp) };
        // SAFETY: calling the IMP with its receiver, selector and argument.
        unsafe { f(self.object, sel, family) != 0 }
    }

    fn max_threadgroup_memory(&self) -> u64 {
        self.call_u64(c"maxThreadgroupMemoryLength").unwrap_or(0)
    }

    fn recommended_working_set(&self) -> Option<u64> {
        if !self.responds_to(c"recommendedMaxWorkingSetSize") {
            return None;
        }
        self.call_u64(c"recommendedMaxWorkingSetSize")
    }

    fn requires_bf16_emulation(&self) -> Option<bool> {
        if !self.responds_to(c"requiresBFloat16Emulation") {
            return None;
        }
        let (imp, sel) = self.imp(c"requiresBFloat16Emulation")?;
        // SAFETY: `-requiresBFloat16Emulation` returns BOOL (unsigned char) and takes no arguments.
        let f = unsafe { std::mem::transmute::<Imp, unsafe extern "C" fn(Id, Sel) -> u8>(imp) };
        // SAFETY: calling the IMP with its receiver and selector.
        Some(unsafe { f(self.object, sel) } != 0)
    }

    fn class_name(&self) -> Option<String> {
        let inspect = self.runtime.inspect?;
        // SAFETY: GCC's `struct objc_object` starts with its class pointer; `object` is live.
        let class = unsafe { *(self.object as *const Class) };
        // SAFETY: a class of this runtime; class_getName returns its NUL-terminated name.
        let name = unsafe { CStr::from_ptr((inspect.class_get_name)(class)) };
        Some(name.to_string_lossy().into_owned())
    }

    fn capability_imps(&self) -> Option<Vec<CapabilityImp>> {
        let inspect = self.runtime.inspect?;
        let mut found = Vec::new();
        // SAFETY: GCC's `struct objc_object` starts with its class pointer; `object` is live.
        let mut class = unsafe { *(self.object as *const Class) };
        while !class.is_null() {
            // SAFETY: a class of this runtime; Nil ends the chain.
            let superclass = unsafe { (inspect.class_get_superclass)(class) };
            for selector in [
                c"supportsFamily:",
                c"maxThreadgroupMemoryLength",
                c"recommendedMaxWorkingSetSize",
            ] {
                let sel = self.runtime.sel(selector);
                // SAFETY: a class of this runtime and a registered selector.
                let method = unsafe { (inspect.class_get_instance_method)(class, sel) };
                // The runtime searches superclasses too: a method belongs to the
                // class whose superclass does not find the same one.
                let inherited = !superclass.is_null()
                    // SAFETY: as above, for the superclass.
                    && unsafe { (inspect.class_get_instance_method)(superclass, sel) } == method;
                if method.is_null() || inherited {
                    continue;
                }
                // SAFETY: `method` came from class_getInstanceMethod.
                let imp = unsafe { (inspect.method_get_implementation)(method) };
                // SAFETY: class_getName returns the class's NUL-terminated name.
                let name = unsafe { CStr::from_ptr((inspect.class_get_name)(class)) };
                found.push(CapabilityImp {
                    class: name.to_string_lossy().into_owned(),
                    selector: selector.to_string_lossy().into_owned(),
                    image: image_of(imp),
                });
            }
            class = superclass;
        }
        Some(found)
    }
}

/// The file name of the loaded image `address` lies in ("?" when none).
fn image_of(address: *mut c_void) -> String {
    // SAFETY: Dl_info is plain old data; all-zero is a valid value for dladdr to overwrite.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return "?".into();
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    path.rsplit('/').next().unwrap_or_default().to_owned()
}

/// Creates `threads` devices at the same moment on as many threads with the
/// library's `SimMetalCreateDevice` (a new device per call): the
/// two-threads-at-once case of the shim's first device. Returns how long each
/// creation took.
pub fn create_concurrently(
    threads: usize,
    scope: Scope,
) -> Result<Vec<std::time::Duration>, String> {
    let create = scope.lookup(c"SimMetalCreateDevice")?;
    // SAFETY: the simulated Metal's `id SimMetalCreateDevice(void)`.
    let create =
        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> Id>(create) };
    let barrier = std::sync::Barrier::new(threads);
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = std::time::Instant::now();
                    // SAFETY: SimMetalCreateDevice is thread-safe (it takes the
                    // simulated registration lock).
                    unsafe { create() };
                    start.elapsed()
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    }))
}
