//! The kernels `metalift-probe --verify` runs: Metal Shading Language source, the
//! inputs, and the answer the CPU computes for the same inputs.
//!
//! One library per kernel, so a kernel the compiler rejects fails only its own row.
//! On macOS the source is compiled by the real Metal compiler; the simulated Metal
//! (`probe/simmetal/compute.m`) recognises each kernel by its function name and runs
//! a C implementation of it.
#![forbid(unsafe_code)]

use super::Job;

/// What a capability claim promises, and the kernel that checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// `has_simdgroup_reduction`: `simd_sum`.
    SimdSum,
    /// `has_simdgroup_reduction`: `simd_max`.
    SimdMax,
    /// `has_simdgroup_mm`: an 8×8 `simdgroup_float8x8` multiply.
    SimdgroupMatrix,
    /// `has_bfloat`: bfloat arithmetic.
    Bfloat,
    /// `maxThreadgroupMemoryLength`: a threadgroup buffer of the claimed size.
    ThreadgroupMemory,
}

impl Capability {
    /// Every kernel, in the order the table prints them.
    pub const ALL: [Capability; 5] = [
        Capability::SimdSum,
        Capability::SimdMax,
        Capability::SimdgroupMatrix,
        Capability::Bfloat,
        Capability::ThreadgroupMemory,
    ];

    /// The kernel's function name (what the simulation recognises).
    #[must_use]
    pub fn function(self) -> &'static str {
        match self {
            Capability::SimdSum => "metalift_simd_sum",
            Capability::SimdMax => "metalift_simd_max",
            Capability::SimdgroupMatrix => "metalift_simdgroup_mm",
            Capability::Bfloat => "metalift_bfloat",
            Capability::ThreadgroupMemory => "metalift_threadgroup",
        }
    }

    /// The claim it checks, as the probe's report names it.
    #[must_use]
    pub fn claim(self) -> &'static str {
        match self {
            Capability::SimdSum | Capability::SimdMax => "has_simdgroup_reduction",
            Capability::SimdgroupMatrix => "has_simdgroup_mm",
            Capability::Bfloat => "has_bfloat",
            Capability::ThreadgroupMemory => "max_threadgroup_memory",
        }
    }
}

/// Threads in one simdgroup on every Apple GPU.
const SIMD_WIDTH: usize = 32;

const SIMD_SUM: &str = r"#include <metal_stdlib>
using namespace metal;

kernel void metalift_simd_sum(device const float *in [[buffer(0)]],
                              device float *out [[buffer(1)]],
                              uint tid [[thread_position_in_grid]])
{
    out[tid] = simd_sum(in[tid]);
}
";

const SIMD_MAX: &str = r"#include <metal_stdlib>
using namespace metal;

kernel void metalift_simd_max(device const float *in [[buffer(0)]],
                              device float *out [[buffer(1)]],
                              uint tid [[thread_position_in_grid]])
{
    out[tid] = simd_max(in[tid]);
}
";

const SIMDGROUP_MM: &str = r"#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

kernel void metalift_simdgroup_mm(device const float *a [[buffer(0)]],
                                  device const float *b [[buffer(1)]],
                                  device float *c [[buffer(2)]])
{
    simdgroup_float8x8 ma;
    simdgroup_float8x8 mb;
    simdgroup_float8x8 mc;
    simdgroup_load(ma, a, 8);
    simdgroup_load(mb, b, 8);
    simdgroup_multiply(mc, ma, mb);
    simdgroup_store(mc, c, 8);
}
";

const BFLOAT: &str = r"#include <metal_stdlib>
using namespace metal;

kernel void metalift_bfloat(device const float *a [[buffer(0)]],
                            device const float *b [[buffer(1)]],
                            device float *out [[buffer(2)]],
                            uint tid [[thread_position_in_grid]])
{
    bfloat x = bfloat(a[tid]);
    bfloat y = bfloat(b[tid]);
    bfloat one = bfloat(1.0f);
    out[tid] = float(x * y + one);
}
";

const THREADGROUP: &str = r"#include <metal_stdlib>
using namespace metal;

kernel void metalift_threadgroup(device uint *out [[buffer(0)]],
                                 device const uint *words [[buffer(1)]],
                                 threadgroup uint *scratch [[threadgroup(0)]],
                                 uint tid [[thread_position_in_threadgroup]],
                                 uint width [[threads_per_threadgroup]])
{
    uint n = words[0];
    for (uint i = tid; i < n; i += width) {
        scratch[i] = i * 2654435761u + 12345u;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint sum = 0;
    for (uint i = width - 1 - tid; i < n; i += width) {
        sum += scratch[i];
    }
    out[tid] = sum;
}
";

/// What the CPU expects back, and how to compare.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// Floats, equal within a relative 1e-5 (every input and answer here is exact
    /// in binary, so a correct GPU matches bit for bit; the slack is for order).
    Floats(Vec<f32>),
    /// 32-bit unsigned integers, exactly.
    Words(Vec<u32>),
}

/// The job for `capability`, and the CPU's answer. `threadgroup_memory` is the
/// device's claimed `maxThreadgroupMemoryLength`.
#[must_use]
pub fn job(capability: Capability, threadgroup_memory: u64) -> (Job, Expected) {
    match capability {
        Capability::SimdSum | Capability::SimdMax => {
            let max = capability == Capability::SimdMax;
            // 1..=32 (their sum is 528, the value magnitudedev/magnitude's probe
            // checks), and for the maximum a permutation whose largest value sits in
            // the first half of the simdgroup, so a half-wide reduction shows.
            let input: Vec<f32> = (0..SIMD_WIDTH)
                .map(|i| {
                    if max {
                        ((i * 7) % SIMD_WIDTH) as f32 - 10.5
                    } else {
                        (i + 1) as f32
                    }
                })
                .collect();
            let answer = if max {
                input.iter().copied().fold(f32::MIN, f32::max)
            } else {
                input.iter().sum()
            };
            let source = if max { SIMD_MAX } else { SIMD_SUM };
            (
                Job {
                    function: capability.function(),
                    source,
                    buffers: vec![floats(&input), vec![0; SIMD_WIDTH * 4]],
                    output: 1,
                    threads: SIMD_WIDTH as u64,
                    threadgroup_memory: 0,
                },
                Expected::Floats(vec![answer; SIMD_WIDTH]),
            )
        }
        Capability::SimdgroupMatrix => {
            let a: Vec<f32> = (0..64)
                .map(|n| ((n / 8) as f32 - (n % 8) as f32) * 0.5)
                .collect();
            let b: Vec<f32> = (0..64)
                .map(|n| ((n / 8 + 2 * (n % 8)) % 5) as f32 - 2.0)
                .collect();
            let mut c = vec![0f32; 64];
            for i in 0..8 {
                for j in 0..8 {
                    c[i * 8 + j] = (0..8).map(|k| a[i * 8 + k] * b[k * 8 + j]).sum();
                }
            }
            (
                Job {
                    function: capability.function(),
                    source: SIMDGROUP_MM,
                    buffers: vec![floats(&a), floats(&b), vec![0; 64 * 4]],
                    output: 2,
                    threads: SIMD_WIDTH as u64,
                    threadgroup_memory: 0,
                },
                Expected::Floats(c),
            )
        }
        Capability::Bfloat => {
            // Values with few significant bits: every product and sum is exact in
            // bfloat (8 significant bits), so no rounding mode is assumed.
            let a: Vec<f32> = (0..SIMD_WIDTH)
                .map(|i| (i % 8) as f32 * 0.5 + 0.5)
                .collect();
            let b: Vec<f32> = (0..SIMD_WIDTH)
                .map(|i| (i % 5) as f32 * 0.25 - 1.0)
                .collect();
            let out = a.iter().zip(&b).map(|(x, y)| x * y + 1.0).collect();
            (
                Job {
                    function: capability.function(),
                    source: BFLOAT,
                    buffers: vec![floats(&a), floats(&b), vec![0; SIMD_WIDTH * 4]],
                    output: 2,
                    threads: SIMD_WIDTH as u64,
                    threadgroup_memory: 0,
                },
                Expected::Floats(out),
            )
        }
        Capability::ThreadgroupMemory => {
            // Metal wants threadgroup lengths in multiples of 16 bytes.
            let length = threadgroup_memory - threadgroup_memory % 16;
            let words = u32::try_from(length / 4).unwrap_or(u32::MAX);
            let width = SIMD_WIDTH as u32;
            let sums = (0..width)
                .map(|t| {
                    (width - 1 - t..words)
                        .step_by(SIMD_WIDTH)
                        .fold(0u32, |sum, i| {
                            sum.wrapping_add(i.wrapping_mul(2_654_435_761).wrapping_add(12345))
                        })
                })
                .collect();
            (
                Job {
                    function: capability.function(),
                    source: THREADGROUP,
                    buffers: vec![vec![0; SIMD_WIDTH * 4], words.to_le_bytes().to_vec()],
                    output: 0,
                    threads: SIMD_WIDTH as u64,
                    threadgroup_memory: length,
                },
                Expected::Words(sums),
            )
        }
    }
}

fn floats(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Expected {
    /// The same answer with its first value changed: the control, a check built
    /// to come out `differs` (see `super::control`).
    #[must_use]
    pub fn perturbed(mut self) -> Expected {
        match &mut self {
            Expected::Floats(v) => {
                if let Some(x) = v.first_mut() {
                    *x += 1.0;
                }
            }
            Expected::Words(v) => {
                if let Some(x) = v.first_mut() {
                    *x = x.wrapping_add(1);
                }
            }
        }
        self
    }

    /// `None` when `bytes` holds the expected answer, else where it first differs.
    #[must_use]
    pub fn mismatch(&self, bytes: &[u8]) -> Option<String> {
        let words: Vec<[u8; 4]> = bytes
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect();
        let len = match self {
            Expected::Floats(v) => v.len(),
            Expected::Words(v) => v.len(),
        };
        if words.len() < len {
            return Some(format!("{} values back, {len} expected", words.len()));
        }
        for i in 0..len {
            let (ok, got, want) = match self {
                Expected::Floats(v) => {
                    let got = f32::from_le_bytes(words[i]);
                    let want = v[i];
                    let ok = (got - want).abs() <= 1e-5 * want.abs().max(1.0);
                    (ok, got.to_string(), want.to_string())
                }
                Expected::Words(v) => {
                    let got = u32::from_le_bytes(words[i]);
                    (got == v[i], got.to_string(), v[i].to_string())
                }
            };
            if !ok {
                return Some(format!("[{i}] = {got}, the CPU says {want}"));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reduction_of_one_to_thirty_two_is_528() {
        let (_, expected) = job(Capability::SimdSum, 32768);
        assert_eq!(expected, Expected::Floats(vec![528.0; 32]));
    }

    #[test]
    fn a_half_wide_maximum_differs_from_the_expected_one() {
        let (job, expected) = job(Capability::SimdMax, 32768);
        let input: Vec<f32> = job.buffers[0]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let second_half = input[16..].iter().copied().fold(f32::MIN, f32::max);
        let mut half_wide = vec![input[..16].iter().copied().fold(f32::MIN, f32::max); 16];
        half_wide.extend([second_half; 16]);
        assert!(expected.mismatch(&floats(&half_wide)).is_some());
    }

    #[test]
    fn a_transposed_product_differs_and_the_product_matches() {
        let (_, expected) = job(Capability::SimdgroupMatrix, 32768);
        let Expected::Floats(c) = &expected else {
            panic!("floats expected")
        };
        let transposed: Vec<f32> = (0..64).map(|n| c[(n % 8) * 8 + n / 8]).collect();
        assert!(expected.mismatch(&floats(&transposed)).is_some());
        assert_eq!(expected.mismatch(&floats(c)), None);
    }

    #[test]
    fn the_threadgroup_buffer_is_the_claimed_size_rounded_to_16_bytes() {
        let (job, _) = job(Capability::ThreadgroupMemory, 32770);
        assert_eq!(job.threadgroup_memory, 32768);
        assert_eq!(job.buffers[1], 8192u32.to_le_bytes().to_vec());
    }
}
