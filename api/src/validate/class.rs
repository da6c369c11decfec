//! The rules of a SmolVMClass write (V12): the class's fields against the policy, as the SmolVM
//! rules V2, V3, V4 and V11 judge them (a class shares their paths), and at most one default.

use crate::{
    admission::Operation,
    class::SmolVMClass,
    constants::{ANNOTATION_IS_DEFAULT_CLASS, LABEL_CLASS},
};

use super::{
    context::*,
    fields::{Unset, check_spec_fields},
    verdict::*,
};

/// Validates a SmolVMClass write. At CREATE and UPDATE every field the class sets lies within
/// the policy (V2, V3, V4, V11, with the SmolVM's paths and messages), and a class that becomes
/// the default is refused while another one is (V12). At DELETE nothing is refused: SmolVMs made
/// from the class are complete without it; the answer warns how many name it.
pub fn validate_smolvm_class(
    op: Operation,
    old: Option<&SmolVMClass>,
    new: &SmolVMClass,
    ctx: &Context<'_>,
) -> Verdict {
    let mut verdict = Verdict::default();
    match op {
        Operation::Create | Operation::Update => {}
        Operation::Delete => {
            if let Some(count) = ctx.classes.users(new.name()).filter(|n| *n > 0) {
                verdict.warning(
                    RuleId::V12,
                    "metadata.name",
                    render(new.name()),
                    format!(
                        "{count} SmolVM(s) name the class {}; they keep the values it gave them (kubectl get svm -A -l {LABEL_CLASS}={})",
                        render(new.name()),
                        new.name()
                    ),
                );
            }
            return verdict;
        }
        Operation::Connect => return verdict,
    }
    check_spec_fields(&new.as_smolvm_spec(), ctx.policy, Unset::Skipped, &mut verdict);

    let was_default = old.is_some_and(SmolVMClass::is_default);
    if new.is_default() && !was_default {
        let mut others: Vec<String> = ctx
            .classes
            .defaults()
            .iter()
            .map(|c| c.name().to_string())
            .filter(|n| n != new.name())
            .collect();
        others.sort();
        if let Some(first) = others.first() {
            verdict.violation(
                RuleId::V12,
                &format!("metadata.annotations[{}]", render(ANNOTATION_IS_DEFAULT_CLASS)),
                render("true"),
                format!(
                    "the class {} is the default already: at most one SmolVMClass is the default; remove the annotation from {} first",
                    render(first),
                    render(first)
                ),
            );
        }
    }
    verdict
}
