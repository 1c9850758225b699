//! The shape of a thread-block cluster launch and the rules it must satisfy, checked on the
//! host so a bad shape is a [`ClusterError`] naming the axis rather than a driver error code.
//! A leaf: it uses nothing else in the crate, so the crate's error types can wrap its error.

/// Most CTAs in a cluster that every cluster-capable GPU supports.
pub const PORTABLE_CLUSTER_SIZE: u32 = 8;

/// A cluster shape that cannot be launched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// A cluster dimension is zero.
    #[error("cluster dimension {axis}: expected at least 1, got 0")]
    Zero {
        /// `x`, `y` or `z`.
        axis: char,
    },
    /// The grid is not a whole number of clusters along an axis.
    #[error("grid dimension {axis}: {grid} is not a multiple of the cluster dimension {cluster}")]
    Indivisible {
        /// `x`, `y` or `z`.
        axis: char,
        /// The grid's extent.
        grid: u32,
        /// The cluster's extent.
        cluster: u32,
    },
    /// More than 8 CTAs per cluster without opting in to non-portable sizes.
    #[error(
        "cluster {cluster:?} has {size} CTAs, above the portable {PORTABLE_CLUSTER_SIZE}: \
         set `non_portable` (Hopper allows up to 16)"
    )]
    NonPortable {
        /// The cluster shape.
        cluster: [u32; 3],
        /// CTAs per cluster.
        size: u64,
    },
}

/// Grid and cluster shape of one `cuLaunchKernelEx` launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterLaunch {
    /// CTAs along x, y, z; each a multiple of the cluster's extent.
    pub grid: [u32; 3],
    /// CTAs per cluster along x, y, z (`[1, 1, 1]`: no cluster attribute is sent).
    pub cluster: [u32; 3],
    /// Allows clusters of more than [`PORTABLE_CLUSTER_SIZE`] CTAs by setting the function's
    /// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED` before the launch.
    pub non_portable: bool,
}

impl ClusterLaunch {
    /// A launch of `grid` CTAs in clusters of `cluster`, portable sizes only.
    pub fn new(grid: [u32; 3], cluster: [u32; 3]) -> ClusterLaunch {
        ClusterLaunch {
            grid,
            cluster,
            non_portable: false,
        }
    }

    /// The same launch allowing non-portable cluster sizes (9..=16 CTAs on Hopper).
    pub fn non_portable(mut self) -> ClusterLaunch {
        self.non_portable = true;
        self
    }

    /// CTAs per cluster.
    pub fn cluster_size(&self) -> u64 {
        self.cluster.iter().map(|&c| c as u64).product()
    }

    /// Checks the cluster shape against the grid (the grid itself is checked by the driver).
    pub fn check(&self) -> Result<(), ClusterError> {
        for ((axis, &g), &c) in ['x', 'y', 'z'].iter().zip(&self.grid).zip(&self.cluster) {
            if c == 0 {
                return Err(ClusterError::Zero { axis: *axis });
            }
            if !g.is_multiple_of(c) {
                return Err(ClusterError::Indivisible {
                    axis: *axis,
                    grid: g,
                    cluster: c,
                });
            }
        }
        let size = self.cluster_size();
        if size > PORTABLE_CLUSTER_SIZE as u64 && !self.non_portable {
            return Err(ClusterError::NonPortable {
                cluster: self.cluster,
                size,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_must_be_a_whole_number_of_clusters() {
        assert_eq!(ClusterLaunch::new([4, 3, 1], [2, 1, 1]).check(), Ok(()));
        assert_eq!(
            ClusterLaunch::new([5, 1, 1], [2, 1, 1]).check(),
            Err(ClusterError::Indivisible {
                axis: 'x',
                grid: 5,
                cluster: 2
            })
        );
        assert_eq!(
            ClusterLaunch::new([4, 6, 3], [2, 2, 2]).check(),
            Err(ClusterError::Indivisible {
                axis: 'z',
                grid: 3,
                cluster: 2
            })
        );
        assert_eq!(
            ClusterLaunch::new([4, 4, 1], [1, 0, 1]).check(),
            Err(ClusterError::Zero { axis: 'y' })
        );
    }

    #[test]
    fn more_than_eight_ctas_needs_the_non_portable_knob() {
        let big = ClusterLaunch::new([32, 1, 1], [16, 1, 1]);
        assert_eq!(
            big.check(),
            Err(ClusterError::NonPortable {
                cluster: [16, 1, 1],
                size: 16
            })
        );
        assert_eq!(big.non_portable().check(), Ok(()));
        assert_eq!(ClusterLaunch::new([8, 2, 1], [4, 2, 1]).check(), Ok(()));
    }

    #[test]
    fn error_messages_name_the_axis_and_the_rule() {
        let e = ClusterError::Indivisible {
            axis: 'x',
            grid: 5,
            cluster: 2,
        };
        assert_eq!(
            e.to_string(),
            "grid dimension x: 5 is not a multiple of the cluster dimension 2"
        );
    }
}
