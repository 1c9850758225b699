//! Compilation targets.

use std::fmt;
use std::str::FromStr;

/// A GPU architecture kiln generates code for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Ampere/Ada and later (portable): `mma.sync`, `ldmatrix`, `cp.async`. Runs on Hopper.
    Sm80,
    /// Hopper: wgmma, TMA, mbarrier, warp specialisation. Arch-specific PTX.
    Sm90a,
    /// Blackwell: tcgen05, tensor memory, TMA. Arch-specific PTX.
    Sm100a,
}

impl Target {
    /// Every target, in order.
    pub const ALL: [Target; 3] = [Target::Sm80, Target::Sm90a, Target::Sm100a];

    /// The best target kiln has for a GPU of compute capability `(major, minor)`: sm_90a on
    /// Hopper (9.0); sm_80 on every other GPU, Blackwell included until its backend exists.
    pub fn best_for(compute_capability: (u32, u32)) -> Target {
        match compute_capability {
            (9, 0) => Target::Sm90a,
            _ => Target::Sm80,
        }
    }

    /// Per-multiprocessor resources of the target's reference GPU (A100, H100/H200, B200):
    /// what bounds how many blocks of a kernel run on one SM at once.
    pub fn sm_limits(self) -> SmLimits {
        SmLimits {
            registers: 65536,
            threads: 2048,
            blocks: 32,
            shared_bytes: match self {
                Target::Sm80 => 167_936,
                Target::Sm90a | Target::Sm100a => 233_472,
            },
        }
    }

    /// The name used on the command line, in `.target` and by `ptxas -arch`.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90a => "sm_90a",
            Target::Sm100a => "sm_100a",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn blocks_per_sm_follow_the_tightest_resource() {
        let h = Target::Sm90a.sm_limits();
        // The warp-specialised attention: 384 threads at 168 registers, 229 KB of smem.
        assert_eq!(h.blocks_per_sm(384, 168, 229_432), 1);
        // 128 threads at 255 registers: 4 warps x 8192 registers, 2 blocks by registers.
        assert_eq!(h.blocks_per_sm(128, 255, 0), 2);
        // 256 threads at 32 registers, no smem: the 2048-thread limit.
        assert_eq!(h.blocks_per_sm(256, 32, 0), 8);
        // sm_80's smaller shared memory: 98 KB blocks fit once.
        assert_eq!(Target::Sm80.sm_limits().blocks_per_sm(128, 128, 98_304), 1);
    }

    #[test]
    fn hopper_gets_its_own_target() {
        assert_eq!(Target::best_for((9, 0)), Target::Sm90a);
        for cc in [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0)] {
            assert_eq!(Target::best_for(cc), Target::Sm80, "{cc:?}");
        }
    }
}

/// Resources of one streaming multiprocessor ([`Target::sm_limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLimits {
    /// 32-bit registers.
    pub registers: u32,
    /// Resident threads.
    pub threads: u32,
    /// Resident blocks.
    pub blocks: u32,
    /// Shared memory bytes (what blocks may take together).
    pub shared_bytes: u32,
}

impl SmLimits {
    /// Blocks of `threads` threads using `registers` registers per thread and `shared_bytes`
    /// of shared memory each that fit on one SM (registers go to warps in units of 256).
    pub fn blocks_per_sm(&self, threads: u32, registers: u32, shared_bytes: u32) -> u32 {
        let warps = threads.div_ceil(32).max(1);
        let per_warp = (registers * 32).next_multiple_of(256).max(256);
        let by_regs = self.registers / (warps * per_warp);
        let by_threads = self.threads / (warps * 32);
        let by_smem = self
            .shared_bytes
            .checked_div(shared_bytes)
            .unwrap_or(u32::MAX);
        by_regs.min(by_threads).min(by_smem).min(self.blocks)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for an unknown target name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{0}`; expected one of {names}", names = Target::ALL.map(Target::name).join(", "))]
pub struct UnknownTarget(pub String);

impl FromStr for Target {
    type Err = UnknownTarget;
    fn from_str(s: &str) -> Result<Target, UnknownTarget> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == s || t.name().replace('_', "") == s)
            .ok_or_else(|| UnknownTarget(s.to_string()))
    }
}
