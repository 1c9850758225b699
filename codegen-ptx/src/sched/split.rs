//! How the roles split the CTA: each role's warps branch to its code, give registers back
//! or take them, and where one thread issues a role's program the others exit.

use kiln_ir::sched::Role;

use crate::emit::Emitter;

/// `setmaxnreg.{how}` to `role`'s register budget, if it has one (`dec` gives registers back,
/// `inc` takes them).
pub(crate) fn set_registers(e: &mut Emitter<'_>, role: &Role, how: &str) {
    if let Some(regs) = role.regs {
        e.ins(format!("setmaxnreg.{how}.sync.aligned.u32 {regs}"));
    }
}

/// Every thread of `role` but the first of its first warp exits: that one issues the role's
/// program.
pub(crate) fn elect(e: &mut Emitter<'_>, role: &Role) {
    let idle = e.setp("ne.u32", e.tid, 32 * role.first_warp);
    e.ins(format!("@{idle} exit"));
}
