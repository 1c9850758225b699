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
    fn hopper_gets_its_own_target() {
        assert_eq!(Target::best_for((9, 0)), Target::Sm90a);
        for cc in [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0)] {
            assert_eq!(Target::best_for(cc), Target::Sm80, "{cc:?}");
        }
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
