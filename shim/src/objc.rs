//! The Objective-C runtime, reached through `dlsym` only once a Metal image is
//! present — the shim itself links no `libobjc`.
//!
//! Why not `objc2`: the same eight runtime functions exist with the same C
//! signatures in Apple's runtime and in GCC's (`<objc/runtime.h>`), so a table of
//! function pointers gives identical hook code on macOS and on the Linux
//! simulation, while a `/bin/true` with the shim injected never maps `libobjc` on
//! Linux (objc2's `gnustep-1-7` backend would add it as a `DT_NEEDED`, loaded into
//! every injected process). The one difference: GCC's runtime has
//! `object_getClass` only as a header inline, so when `dlsym` cannot find it the
//! class is read from the object's first word, which is the documented layout of
//! GCC's `struct objc_object { Class class_pointer; }`. Apple's runtime exports the
//! function (its `isa` is not a plain pointer there), so the fallback is never
//! used on macOS.

use std::ffi::{c_char, c_void, CStr};

/// An Objective-C object, class, selector or method: opaque pointers.
pub(crate) type Id = *mut c_void;
/// A class (`Class`).
pub(crate) type Class = *mut c_void;
/// A selector (`SEL`).
pub(crate) type Sel = *const c_void;
/// A method (`Method`).
pub(crate) type Method = *mut c_void;
/// A method implementation (`IMP`), as an untyped pointer.
pub(crate) type Imp = *mut c_void;

/// Which symbols `dlsym` may search.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope {
    /// Everything loaded with global visibility (`RTLD_DEFAULT`).
    Global,
    /// One `dlopen` handle and its dependencies (a library loaded `RTLD_LOCAL`).
    /// Only the Linux `dlopen` interposer has handles; dyld reports images instead.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Library(*mut c_void),
}

/// The runtime functions the hooks need, resolved in one scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Runtime {
    get_class: unsafe extern "C" fn(*const c_char) -> Class,
    sel_register_name: unsafe extern "C" fn(*const c_char) -> Sel,
    class_get_instance_method: unsafe extern "C" fn(Class, Sel) -> Method,
    class_get_name: unsafe extern "C" fn(Class) -> *const c_char,
    class_replace_method: unsafe extern "C" fn(Class, Sel, Imp, *const c_char) -> Imp,
    method_get_implementation: unsafe extern "C" fn(Method) -> Imp,
    method_set_implementation: unsafe extern "C" fn(Method, Imp) -> Imp,
    method_get_type_encoding: unsafe extern "C" fn(Method) -> *const c_char,
    object_get_class: Option<unsafe extern "C" fn(Id) -> Class>,
}

// SAFETY: the table holds only function pointers into the runtime, which are
// callable from any thread.
unsafe impl Send for Runtime {}
// SAFETY: as above; the table is never mutated after resolution.
unsafe impl Sync for Runtime {}

fn lookup(scope: Scope, name: &CStr) -> *mut c_void {
    let handle = match scope {
        Scope::Global => libc::RTLD_DEFAULT,
        Scope::Library(handle) => handle,
    };
    // SAFETY: `handle` is RTLD_DEFAULT or a handle the real dlopen just returned; `name` is a C string.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

macro_rules! resolve {
    ($scope:expr, $name:literal, $ty:ty) => {{
        let sym = lookup($scope, $name);
        if sym.is_null() {
            None
        } else {
            // SAFETY: `$name` is the runtime function whose C signature is `$ty` in both
            // Apple's <objc/runtime.h> and GCC's.
            Some(unsafe { std::mem::transmute::<*mut c_void, $ty>(sym) })
        }
    }};
}

impl Runtime {
    /// Resolves the table in `scope`; `None` when no Objective-C runtime is there.
    pub(crate) fn resolve(scope: Scope) -> Option<Runtime> {
        Some(Runtime {
            get_class: resolve!(
                scope,
                c"objc_getClass",
                unsafe extern "C" fn(*const c_char) -> Class
            )?,
            sel_register_name: resolve!(
                scope,
                c"sel_registerName",
                unsafe extern "C" fn(*const c_char) -> Sel
            )?,
            class_get_instance_method: resolve!(
                scope,
                c"class_getInstanceMethod",
                unsafe extern "C" fn(Class, Sel) -> Method
            )?,
            class_get_name: resolve!(
                scope,
                c"class_getName",
                unsafe extern "C" fn(Class) -> *const c_char
            )?,
            class_replace_method: resolve!(
                scope,
                c"class_replaceMethod",
                unsafe extern "C" fn(Class, Sel, Imp, *const c_char) -> Imp
            )?,
            method_get_implementation: resolve!(
                scope,
                c"method_getImplementation",
                unsafe extern "C" fn(Method) -> Imp
            )?,
            method_set_implementation: resolve!(
                scope,
                c"method_setImplementation",
                unsafe extern "C" fn(Method, Imp) -> Imp
            )?,
            method_get_type_encoding: resolve!(
                scope,
                c"method_getTypeEncoding",
                unsafe extern "C" fn(Method) -> *const c_char
            )?,
            object_get_class: resolve!(
                scope,
                c"object_getClass",
                unsafe extern "C" fn(Id) -> Class
            ),
        })
    }

    /// `objc_getClass(name)`, or `None` when no such class is registered.
    pub(crate) fn class(&self, name: &CStr) -> Option<Class> {
        // SAFETY: `name` is a C string; an unknown name yields nil.
        let class = unsafe { (self.get_class)(name.as_ptr()) };
        (!class.is_null()).then_some(class)
    }

    /// `sel_registerName(name)`.
    pub(crate) fn sel(&self, name: &CStr) -> Sel {
        // SAFETY: `name` is a C string; the runtime copies or interns it.
        unsafe { (self.sel_register_name)(name.as_ptr()) }
    }

    /// `class_getInstanceMethod`, searching superclasses; `None` when absent.
    pub(crate) fn instance_method(&self, class: Class, sel: Sel) -> Option<Method> {
        // SAFETY: `class` is a class from this runtime and `sel` one of its selectors.
        let method = unsafe { (self.class_get_instance_method)(class, sel) };
        (!method.is_null()).then_some(method)
    }

    /// `method_getImplementation`.
    pub(crate) fn implementation(&self, method: Method) -> Imp {
        // SAFETY: `method` came from class_getInstanceMethod.
        unsafe { (self.method_get_implementation)(method) }
    }

    /// `method_setImplementation`; returns the previous implementation.
    pub(crate) fn set_implementation(&self, method: Method, imp: Imp) -> Imp {
        // SAFETY: `method` came from class_getInstanceMethod; `imp` has the method's signature
        // (the caller installs only IMPs written for the selector).
        unsafe { (self.method_set_implementation)(method, imp) }
    }

    /// `method_getTypeEncoding`.
    pub(crate) fn type_encoding(&self, method: Method) -> *const c_char {
        // SAFETY: `method` came from class_getInstanceMethod.
        unsafe { (self.method_get_type_encoding)(method) }
    }

    /// `class_replaceMethod`: replaces the class's own method, or adds an override
    /// of an inherited one.
    pub(crate) fn replace_method(&self, class: Class, sel: Sel, imp: Imp, types: *const c_char) {
        // SAFETY: `class`/`sel` are from this runtime, `types` is the method's own
        // encoding, and `imp` has that signature.
        unsafe { (self.class_replace_method)(class, sel, imp, types) };
    }

    /// The class of a live object.
    pub(crate) fn class_of(&self, object: Id) -> Class {
        match self.object_get_class {
            // SAFETY: `object` is a live instance handed to us by the runtime.
            Some(get) => unsafe { get(object) },
            // SAFETY: GCC's runtime: `struct objc_object` begins with its class pointer.
            None => unsafe { *(object as *const Class) },
        }
    }

    /// `class_getName`, lossily as a Rust string.
    pub(crate) fn class_name(&self, class: Class) -> String {
        // SAFETY: `class` is a class from this runtime.
        let name = unsafe { (self.class_get_name)(class) };
        if name.is_null() {
            return String::from("?");
        }
        // SAFETY: class names are NUL-terminated strings owned by the runtime.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}
