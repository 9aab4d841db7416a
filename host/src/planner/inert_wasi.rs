//! The few WASI functions a planner built on another language's runtime
//! (Python through componentize-py, JavaScript through componentize-js)
//! calls while it starts, answered without granting anything: no
//! environment, no arguments, no working directory, a clock that stands at
//! the Unix epoch, and "random" bytes that are the same on every call. A
//! planner stays pure and its answers deterministic, as the contract says.
//! and no preopened directories. Every other WASI import (files, sockets,
//! streams, polling, exit) is left to trap when called, naming itself.

use wasmtime::Engine;
use wasmtime::component::{Component, ComponentType, Linker, Lower, ResourceAny};

/// `wasi:clocks/wall-clock`'s `datetime`.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
struct Datetime {
    seconds: u64,
    nanoseconds: u32,
}

/// The same bytes every time: a planner may not depend on chance.
fn fixed_bytes(len: u64) -> Vec<u8> {
    // At most what one call may ask for; a runtime seeding its hash tables asks for a few dozen.
    vec![0x5a; len.min(1 << 16) as usize]
}

/// Defines the inert functions for each WASI interface `component` imports,
/// whatever its WASI version.
pub(crate) fn define<T: 'static>(linker: &mut Linker<T>, component: &Component, engine: &Engine) -> wasmtime::Result<()> {
    let imports: Vec<String> = component.component_type().imports(engine).map(|(name, _)| name.to_string()).collect();
    for name in imports {
        let interface = name.split_once('@').map_or(name.as_str(), |(interface, _)| interface);
        match interface {
            "wasi:cli/environment" => {
                let mut instance = linker.instance(&name)?;
                instance.func_wrap("get-environment", |_, (): ()| Ok((Vec::<(String, String)>::new(),)))?;
                instance.func_wrap("get-arguments", |_, (): ()| Ok((Vec::<String>::new(),)))?;
                instance.func_wrap("initial-cwd", |_, (): ()| Ok((None::<String>,)))?;
            }
            "wasi:random/random" => {
                let mut instance = linker.instance(&name)?;
                instance.func_wrap("get-random-bytes", |_, (len,): (u64,)| Ok((fixed_bytes(len),)))?;
                instance.func_wrap("get-random-u64", |_, (): ()| Ok((0x5a5a_5a5a_5a5a_5a5a_u64,)))?;
            }
            "wasi:random/insecure" => {
                let mut instance = linker.instance(&name)?;
                instance.func_wrap("get-insecure-random-bytes", |_, (len,): (u64,)| Ok((fixed_bytes(len),)))?;
                instance.func_wrap("get-insecure-random-u64", |_, (): ()| Ok((0x5a5a_5a5a_5a5a_5a5a_u64,)))?;
            }
            "wasi:random/insecure-seed" => {
                let mut instance = linker.instance(&name)?;
                instance.func_wrap("insecure-seed", |_, (): ()| Ok(((0x5a5a_5a5a_5a5a_5a5a_u64, 0xa5a5_a5a5_a5a5_a5a5_u64),)))?;
            }
            "wasi:clocks/wall-clock" => {
                let mut instance = linker.instance(&name)?;
                let epoch = Datetime { seconds: 0, nanoseconds: 0 };
                instance.func_wrap("now", move |_, (): ()| Ok((epoch,)))?;
                instance.func_wrap("resolution", |_, (): ()| Ok((Datetime { seconds: 1, nanoseconds: 0 },)))?;
            }
            "wasi:clocks/monotonic-clock" => {
                let mut instance = linker.instance(&name)?;
                instance.func_wrap("now", |_, (): ()| Ok((0u64,)))?;
                instance.func_wrap("resolution", |_, (): ()| Ok((1u64,)))?;
            }
            "wasi:filesystem/preopens" => {
                // No directories: the planner sees an empty file system.
                let mut instance = linker.instance(&name)?;
                instance.func_wrap("get-directories", |_, (): ()| Ok((Vec::<(ResourceAny, String)>::new(),)))?;
            }
            _ => {}
        }
    }
    Ok(())
}
