/*
 * libmetalift-inert: what `uninstall.sh --force` leaves at the shim's path while
 * a launchd job, a launchd environment or a shell profile still names it in
 * DYLD_INSERT_LIBRARIES. dyld halts a launch whose inserted library it cannot
 * load (dyld-1378, dyld/DyldRuntimeState.cpp, RuntimeState::loadInsertedLibraries),
 * so the path must keep holding a loadable library: this one. It has no
 * constructor, no data, no exported function and no import but libSystem (the
 * linker adds it); a process that loads it runs stock.
 *
 * Every slice an injected process can be (dyld kills a process whose inserted
 * library lacks its slice, Rosetta's x86_64 included): built by pkg/build.sh
 * (arm64 + arm64e + x86_64, Apple clang), scripts/macos-build.sh (arm64 +
 * x86_64, zig) and pkg/stage.sh (an ELF .so on Linux, for the tests).
 */
typedef int metalift_inert_has_no_code;
