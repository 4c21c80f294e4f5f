//! The compute path on the real Metal (macOS), through `objc2-metal`: a [`Job`]
//! compiled from MSL source by Metal's compiler, run on the device the shim left,
//! and read back.
//!
//! Nothing here has run on a Mac yet: it is type-checked and linked on Linux
//! (`scripts/macos-build.sh`), and `.github/workflows/macos.yml` runs
//! `metalift-probe --verify` on the hosted Apple Silicon runner (listed in
//! `daemon/src/macos/mod.rs`).

use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_foundation::NSString;
use objc2_metal::{
    MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder, MTLCommandQueue,
    MTLComputeCommandEncoder, MTLComputePipelineState, MTLDevice, MTLLibrary, MTLResourceOptions,
    MTLSize,
};

use crate::macos::MetalDevice;
use crate::verify::{Compute, Failure, Job};

/// The real device, as a GPU that runs jobs.
#[derive(Debug)]
pub struct MetalCompute<'a>(pub &'a MetalDevice);

type Pipeline = Retained<ProtocolObject<dyn MTLComputePipelineState>>;
type Buffer = Retained<ProtocolObject<dyn MTLBuffer>>;

impl MetalCompute<'_> {
    fn compile(&self, job: &Job) -> Result<Pipeline, String> {
        let device = self.0.device();
        let library = device
            .newLibraryWithSource_options_error(&NSString::from_str(job.source), None)
            .map_err(|e| e.localizedDescription().to_string())?;
        let function = library
            .newFunctionWithName(&NSString::from_str(job.function))
            .ok_or_else(|| format!("no function {} in the library", job.function))?;
        device
            .newComputePipelineStateWithFunction_error(&function)
            .map_err(|e| e.localizedDescription().to_string())
    }

    fn buffer(&self, bytes: &[u8]) -> Result<Buffer, String> {
        let buffer = self
            .0
            .device()
            .newBufferWithLength_options(bytes.len(), MTLResourceOptions::StorageModeShared)
            .ok_or_else(|| format!("no buffer of {} bytes", bytes.len()))?;
        // SAFETY: a shared buffer's contents are `bytes.len()` bytes of CPU-visible
        // memory, which no command buffer uses yet.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                buffer.contents().as_ptr().cast::<u8>(),
                bytes.len(),
            );
        }
        Ok(buffer)
    }

    fn encode_and_run(
        &self,
        job: &Job,
        pipeline: &Pipeline,
        buffers: &[Buffer],
    ) -> Result<(), String> {
        let queue = self
            .0
            .device()
            .newCommandQueue()
            .ok_or("no command queue")?;
        let command_buffer = queue.commandBuffer().ok_or("no command buffer")?;
        let encoder = command_buffer
            .computeCommandEncoder()
            .ok_or("no compute command encoder")?;
        encoder.setComputePipelineState(pipeline);
        for (index, buffer) in buffers.iter().enumerate() {
            // SAFETY: the buffers outlive the command buffer (we wait for it below)
            // and hold what the kernel's parameters declare; index < 31.
            unsafe { encoder.setBuffer_offset_atIndex(Some(buffer), 0, index) };
        }
        if job.threadgroup_memory > 0 {
            let length = usize::try_from(job.threadgroup_memory).map_err(|e| e.to_string())?;
            // SAFETY: index 0 is the kernel's `[[threadgroup(0)]]`; the length is
            // a multiple of 16 (kernels::job). Whether the device has that much is
            // what this kernel checks.
            unsafe { encoder.setThreadgroupMemoryLength_atIndex(length, 0) };
        }
        let threads = usize::try_from(job.threads).map_err(|e| e.to_string())?;
        encoder.dispatchThreadgroups_threadsPerThreadgroup(
            MTLSize {
                width: 1,
                height: 1,
                depth: 1,
            },
            MTLSize {
                width: threads,
                height: 1,
                depth: 1,
            },
        );
        encoder.endEncoding();
        command_buffer.commit();
        command_buffer.waitUntilCompleted();
        if command_buffer.status() != MTLCommandBufferStatus::Completed {
            return Err(command_buffer.error().map_or_else(
                || format!("command buffer status {}", command_buffer.status().0),
                |e| e.localizedDescription().to_string(),
            ));
        }
        Ok(())
    }
}

impl Compute for MetalCompute<'_> {
    fn run(&self, job: &Job) -> Result<Vec<u8>, Failure> {
        let pipeline = self.compile(job).map_err(Failure::Compile)?;
        let buffers = job
            .buffers
            .iter()
            .map(|b| self.buffer(b))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failure::Run)?;
        self.encode_and_run(job, &pipeline, &buffers)
            .map_err(Failure::Run)?;
        let output = buffers
            .get(job.output)
            .ok_or_else(|| Failure::Run("no output buffer".into()))?;
        let len = job.buffers.get(job.output).map_or(0, Vec::len);
        let mut out = vec![0u8; len];
        // SAFETY: the command buffer completed; a shared buffer's contents are
        // `len` bytes of CPU-visible memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                output.contents().as_ptr().cast::<u8>(),
                out.as_mut_ptr(),
                len,
            );
        }
        Ok(out)
    }
}
