//! The grammar slot and the `grammar_mask` processor with a toy constraint engine: 002's finite
//! language {"ok":true} / {"ok":false} over a six-token vocabulary.

use nextok_core::constraint::{ConstraintState, ConstraintStatus, TokenBitset};
use nextok_core::pipeline::GrammarPolicy;
use nextok_core::processors::ProcessorConfig as P;
use nextok_core::{
    Draw, FinishReason, PipelineConfig, Preset, Sampler, SamplingParams, Selector, StopConfig,
    VocabInfo,
};

const TOKENS: [&str; 6] = ["{\"ok\":", "true", "false", "}", "<eos>", " "];
const EOS: u32 = 4;
const LANGUAGE: [&str; 2] = ["{\"ok\":true}", "{\"ok\":false}"];

#[derive(Debug, Clone)]
struct Finite {
    text: String,
    history: Vec<usize>,
}

impl Finite {
    fn new() -> Self {
        Finite {
            text: String::new(),
            history: vec![],
        }
    }
    fn complete(&self) -> bool {
        LANGUAGE.contains(&self.text.as_str())
    }
}

impl ConstraintState for Finite {
    fn fill_mask(&mut self, allowed: &mut TokenBitset) -> nextok_core::Result<()> {
        for (i, t) in TOKENS.iter().enumerate() {
            let ok = if i as u32 == EOS {
                self.complete()
            } else {
                let next = format!("{}{}", self.text, t);
                LANGUAGE.iter().any(|l| l.starts_with(&next))
            };
            if ok {
                allowed[i / 64] |= 1 << (i % 64);
            }
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> nextok_core::Result<()> {
        if token == EOS {
            return if self.complete() {
                Ok(())
            } else {
                Err(nextok_core::ErrorKind::EmptySupport {
                    stage: "toy".into(),
                }
                .into())
            };
        }
        let next = format!("{}{}", self.text, TOKENS[token as usize]);
        if !LANGUAGE.iter().any(|l| l.starts_with(&next)) {
            return Err(nextok_core::ErrorKind::EmptySupport {
                stage: "toy: rejected".into(),
            }
            .into());
        }
        self.history.push(self.text.len());
        self.text = next;
        Ok(())
    }
    fn status(&self) -> ConstraintStatus {
        if self.complete() {
            ConstraintStatus::OnlyEnd
        } else {
            ConstraintStatus::Running
        }
    }
    fn fork(&self) -> Box<dyn ConstraintState> {
        Box::new(self.clone())
    }
    fn rollback(&mut self, k: usize) -> nextok_core::Result<()> {
        for _ in 0..k {
            if let Some(l) = self.history.pop() {
                self.text.truncate(l);
            }
        }
        Ok(())
    }
    fn forced_bytes(&mut self) -> Vec<u8> {
        if self.text.is_empty() {
            b"{\"ok\":".to_vec()
        } else {
            vec![]
        }
    }
    fn digest(&self) -> String {
        format!("toy:{}", self.text)
    }
}

fn vocab() -> VocabInfo {
    VocabInfo {
        vocab_size: 6,
        eos_token_ids: vec![EOS],
        special_token_ids: vec![EOS],
    }
}

fn sampler(policy: GrammarPolicy, top_k: Option<i64>) -> Sampler {
    let params = SamplingParams {
        constraint: Some(nextok_core::constraint::spec::ConstraintSpec::Choice {
            choices: LANGUAGE.iter().map(|s| s.to_string()).collect(),
        }),
        grammar_policy: Some(policy),
        top_k,
        ..Default::default()
    };
    Sampler::from_params(Preset::Reference, &params, vocab()).unwrap()
}

#[test]
fn the_mask_follows_the_prefix_and_eos_only_where_accepted() {
    let s = sampler(GrammarPolicy::OnlyEnd, None);
    assert!(s
        .config()
        .processors
        .iter()
        .any(|p| p.type_name() == "grammar_mask"));
    let mut st = s.new_state(&[], 7).unwrap();
    st.set_grammar(Box::new(Finite::new()));
    let mut ws = s.new_workspace();
    // the model prefers " " and "<eos>", which the language forbids
    let logits = [0.0, 1.0, 0.5, 0.2, 9.0, 9.0];
    let (sel, rec) = s
        .select_recorded(&logits, &st, &mut ws, Draw::FixedU(0.5), 16)
        .unwrap();
    assert_eq!(sel.token, 0);
    assert_eq!(rec.support_size, 1);
    let r = s.commit(&mut st, 0).unwrap();
    assert_eq!(r, None);
    let (_, rec) = s
        .select_recorded(&logits, &st, &mut ws, Draw::FixedU(0.5), 16)
        .unwrap();
    let support: Vec<u32> = rec.candidates.iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(support, vec![1, 2]); // true, false — EOS not yet
    s.commit(&mut st, 2).unwrap();
    s.commit(&mut st, 3).unwrap_or_else(|e| panic!("{e}"));
    // complete: OnlyEnd status finishes under the only_end policy
    assert_eq!(
        st.finish(),
        nextok_core::FinishStatus::Finished {
            reason: FinishReason::GrammarAccepted
        }
    );
    assert_eq!(st.grammar().unwrap().digest(), "toy:{\"ok\":false}");
}

#[test]
fn a_rejected_token_leaves_the_state_untouched() {
    let s = sampler(GrammarPolicy::OnlyEnd, None);
    let mut st = s.new_state(&[], 7).unwrap();
    st.set_grammar(Box::new(Finite::new()));
    let before = st.clone();
    assert!(s.commit(&mut st, 1).is_err()); // "true" cannot start the output
    assert_eq!(st, before);
    assert_eq!(st.selected_ids(), &[] as &[u32]);
}

#[test]
fn truncation_before_the_mask_that_leaves_nothing_legal_is_a_constraint_error() {
    // top-k 1 runs before the grammar mask in this custom order and keeps " ", which is illegal
    let cfg = PipelineConfig::new(
        vec![
            P::TopK(nextok_core::processors::top_k::TopK {
                version: 1,
                top_k: 1,
                ties: Default::default(),
            }),
            P::GrammarMask(Default::default()),
        ],
        Selector::Categorical,
    );
    let s = Sampler::new(cfg, vocab(), StopConfig::default()).unwrap();
    let mut st = s.new_state(&[], 7).unwrap();
    st.set_grammar(Box::new(Finite::new()));
    let mut ws = s.new_workspace();
    let e = s
        .select(&[0.0, 1.0, 0.5, 0.2, 0.0, 9.0], &st, &mut ws, Draw::Stream)
        .unwrap_err();
    assert_eq!(e.code(), "empty_support");
    assert!(e.to_string().contains("grammar_mask"), "{e}");
}

#[test]
fn policies_stop_on_accept_and_continue() {
    let s = sampler(GrammarPolicy::Continue, None);
    let mut st = s.new_state(&[], 7).unwrap();
    st.set_grammar(Box::new(Finite::new()));
    for t in [0, 1, 3] {
        assert_eq!(s.commit(&mut st, t).unwrap(), None);
    }
    // accepted: the constraint no longer masks, ordinary generation goes on
    assert!(!st.grammar().unwrap().is_active());
    let mut ws = s.new_workspace();
    let (_, rec) = s
        .select_recorded(&[0.0; 6], &st, &mut ws, Draw::FixedU(0.1), 16)
        .unwrap();
    assert_eq!(rec.support_size, 6);

    let s = sampler(GrammarPolicy::StopOnAccept, None);
    let mut st = s.new_state(&[], 7).unwrap();
    st.set_grammar(Box::new(Finite::new()));
    s.commit(&mut st, 0).unwrap();
    s.commit(&mut st, 1).unwrap();
    assert_eq!(
        s.commit(&mut st, 3).unwrap(),
        Some(FinishReason::GrammarAccepted)
    );
}

#[test]
fn cloning_a_state_forks_the_constraint() {
    let s = sampler(GrammarPolicy::OnlyEnd, None);
    let mut a = s.new_state(&[], 7).unwrap();
    a.set_grammar(Box::new(Finite::new()));
    s.commit(&mut a, 0).unwrap();
    let mut b = a.clone();
    s.commit(&mut a, 1).unwrap();
    s.commit(&mut b, 2).unwrap();
    assert_eq!(a.grammar().unwrap().digest(), "toy:{\"ok\":true");
    assert_eq!(b.grammar().unwrap().digest(), "toy:{\"ok\":false");
}

/// Counts the masks the engine is asked for.
#[derive(Debug)]
struct Counting {
    inner: Finite,
    fills: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ConstraintState for Counting {
    fn fill_mask(&mut self, allowed: &mut TokenBitset) -> nextok_core::Result<()> {
        self.fills.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.fill_mask(allowed)
    }
    fn commit(&mut self, token: u32) -> nextok_core::Result<()> {
        self.inner.commit(token)
    }
    fn status(&self) -> ConstraintStatus {
        self.inner.status()
    }
    fn fork(&self) -> Box<dyn ConstraintState> {
        Box::new(Counting {
            inner: self.inner.clone(),
            fills: self.fills.clone(),
        })
    }
    fn rollback(&mut self, k: usize) -> nextok_core::Result<()> {
        self.inner.rollback(k)
    }
    fn forced_bytes(&mut self) -> Vec<u8> {
        self.inner.forced_bytes()
    }
    fn digest(&self) -> String {
        self.inner.digest()
    }
}

#[test]
fn a_mask_prepared_on_another_thread_is_used_once_and_dropped_on_commit() {
    let s = sampler(GrammarPolicy::OnlyEnd, None);
    let logits = [0.3, 1.0, 0.9, 0.2, 9.0, 9.0];
    let run = |prepare: bool| {
        let fills = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut st = s.new_state(&[], 11).unwrap();
        st.set_grammar(Box::new(Counting {
            inner: Finite::new(),
            fills: fills.clone(),
        }));
        let mut ws = s.new_workspace();
        let mut lines = vec![];
        while st.finish() == nextok_core::FinishStatus::Running {
            if prepare {
                std::thread::scope(|sc| sc.spawn(|| s.prepare(&st)).join().unwrap()).unwrap();
                assert!(st.grammar().unwrap().mask_ready());
                // reading the state (as a step record does) keeps the prepared mask
                let _ = st.grammar().unwrap().digest();
                assert!(st.grammar().unwrap().mask_ready());
            }
            let (res, rec) = s
                .step_recorded(&logits, &mut st, &mut ws, Draw::Stream, 8)
                .unwrap();
            // the committed token changed the engine state: the cached mask is gone
            assert!(!st.grammar().unwrap().mask_ready());
            lines.push((res.token, serde_json::to_string(&rec).unwrap()));
        }
        (lines, fills.load(std::sync::atomic::Ordering::SeqCst))
    };
    let (plain, plain_fills) = run(false);
    let (prepared, prepared_fills) = run(true);
    assert_eq!(plain, prepared);
    assert_eq!(plain.len(), 3); // {"ok": · true|false · }, then the grammar accepts
                                // one mask per step whether prepared or not
    assert_eq!(plain_fills, plain.len());
    assert_eq!(prepared_fills, plain.len());
}
