//! Per-sequence sampling. Every parameter here is applied, or the request is refused upstream: a
//! parameter accepted and ignored is a silent wrong answer (the tests below check that each one
//! changes the distribution as it should).
//!
//! Order: logit_bias → penalties (over the response tokens) → greedy if temperature is 0 →
//! softmax(logits / T) → top-k → exact top-p (the shortest prefix of the whole sorted vocabulary
//! with that mass: a fixed truncation of Mimir's 262k vocabulary misses mass in the long tail) →
//! min-p → renormalize → draw with a seeded ChaCha8 stream.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// Sampling parameters of one sequence (OpenAI names; 0/1 values mean "off").
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    pub seed: Option<u64>,
    /// CTRL rule over response tokens: positive logits divided, negative multiplied. 1 = off.
    pub repetition_penalty: f32,
    /// Subtracted once per occurrence in the response. 0 = off.
    pub frequency_penalty: f32,
    /// Subtracted once if present in the response. 0 = off.
    pub presence_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: vec![],
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the message names the parameter.
    pub fn validate(&self, n_vocab: usize) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature <= 100.0) {
            return Err(format!("temperature must be in [0, 100], got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(format!("repetition_penalty must be positive, got {}", self.repetition_penalty));
        }
        for (name, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= n_vocab {
                return Err(format!("logit_bias token {id} is outside the vocabulary ({n_vocab})"));
            }
            if !(-100.0..=100.0).contains(&b) {
                return Err(format!("logit_bias values must be in [-100, 100], got {b}"));
            }
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// A sampler with its own random stream and the response-token counts penalties need.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: ChaCha8Rng,
    counts: HashMap<u32, u32>,
}

/// A token chosen, with its log-probability under the final (post-penalty, tempered)
/// distribution the draw used — what OpenAI's `logprobs` reports.
#[derive(Debug, Clone, Copy)]
pub struct Choice {
    pub token: u32,
    pub logprob: f32,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        Sampler { params, rng: ChaCha8Rng::seed_from_u64(seed), counts: HashMap::new() }
    }

    /// Records a response token (penalties count only the response, never the prompt).
    pub fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_default() += 1;
    }

    /// Applies bias and penalties in place.
    pub fn adjust(&self, logits: &mut [f32]) {
        let p = &self.params;
        for &(id, b) in &p.logit_bias {
            logits[id as usize] += b;
        }
        for (&id, &n) in &self.counts {
            let l = &mut logits[id as usize];
            if p.repetition_penalty != 1.0 {
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
            }
            *l -= p.frequency_penalty * n as f32 + if n > 0 { p.presence_penalty } else { 0.0 };
        }
    }

    /// Chooses the next token from raw logits (modified in place by bias and penalties).
    pub fn sample(&mut self, logits: &mut [f32]) -> Choice {
        self.adjust(logits);
        self.draw(logits)
    }

    /// As `sample`, among the tokens `allowed` accepts (constrained decoding). None if no
    /// token is allowed.
    pub fn sample_allowed(&mut self, logits: &mut [f32], allowed: impl Fn(u32) -> bool) -> Option<Choice> {
        self.adjust(logits);
        self.draw_allowed(logits, allowed)
    }

    /// `sample_allowed` on logits already adjusted (a redraw after refusing a choice). Without
    /// top-k/top-p/min-p it is one draw from the masked distribution; with them the first
    /// draw is unconstrained and kept if allowed, else every disallowed logit is set to -inf
    /// and the draw repeated (the cuts then apply to the allowed tokens).
    pub fn draw_allowed(&mut self, logits: &mut [f32], allowed: impl Fn(u32) -> bool) -> Option<Choice> {
        if self.uncut() {
            return self.draw_where(logits, allowed);
        }
        let first = self.draw(logits);
        if allowed(first.token) {
            return Some(first);
        }
        let mut any = false;
        for (i, l) in logits.iter_mut().enumerate() {
            if allowed(i as u32) {
                any = true;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        any.then(|| self.draw(logits))
    }

    /// No top-k, top-p or min-p cut: a draw needs no sorted distribution.
    fn uncut(&self) -> bool {
        let p = &self.params;
        p.is_greedy() || (p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0)
    }

    /// Greedy, or one draw from softmax(logits / T) over the allowed tokens, in three passes
    /// without sorting (Mimir's 262k vocabulary makes a sort per token the sampler's cost).
    fn draw_where(&mut self, logits: &[f32], allowed: impl Fn(u32) -> bool) -> Option<Choice> {
        let ok = |i: usize, l: f32| l > f32::NEG_INFINITY && allowed(i as u32);
        let (mut best, mut max) = (None, f32::NEG_INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            if l > max && ok(i, l) {
                (best, max) = (Some(i), l);
            }
        }
        let best = best?;
        if self.params.is_greedy() {
            return Some(Choice { token: best as u32, logprob: log_softmax_at(logits, best, 1.0) });
        }
        let t = self.params.temperature.max(1e-6);
        let weight = |l: f32| ((l - max) / t).exp() as f64;
        let total: f64 = logits.iter().enumerate().filter(|&(i, &l)| ok(i, l)).map(|(_, &l)| weight(l)).sum();
        let target = self.rng.random::<f64>() * total;
        let mut acc = 0.0;
        let mut last = best;
        for (i, &l) in logits.iter().enumerate() {
            if ok(i, l) {
                acc += weight(l);
                last = i;
                if acc > target {
                    break;
                }
            }
        }
        Some(Choice { token: last as u32, logprob: (weight(logits[last]) / total).ln() as f32 })
    }

    fn draw(&mut self, logits: &[f32]) -> Choice {
        if self.uncut() {
            return self.draw_where(logits, |_| true).unwrap_or(Choice { token: 0, logprob: 0.0 });
        }
        if self.params.is_greedy() {
            let token = argmax(logits);
            return Choice { token, logprob: log_softmax_at(logits, token as usize, 1.0) };
        }
        let probs = self.distribution(logits);
        let r: f32 = self.rng.random::<f32>();
        let mut acc = 0.0f32;
        let mut last = probs[0];
        for &(id, p) in probs.iter().filter(|x| x.1 > 0.0) {
            acc += p;
            last = (id, p);
            if r < acc {
                return Choice { token: id, logprob: p.ln() };
            }
        }
        Choice { token: last.0, logprob: last.1.ln() }
    }

    /// The filtered, renormalized distribution (id, probability), most likely first (ties: lower
    /// id first). The tokens top-k, top-p and min-p keep are a prefix of that order, so only a
    /// prefix is sorted: min-p's and top-k's lengths are counted, then the `m` most likely tokens
    /// are selected (`select_nth_unstable`, linear in the vocabulary) and sorted, for m = 256,
    /// 1,024, … until top-p's cut falls inside them. Exact (the tests compare it with a full
    /// sort); a peaked distribution sorts at most a few hundred entries, a flat one with top-p
    /// near 1 ends in a full sort.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        let p = &self.params;
        let t = p.temperature.max(1e-6);
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut probs: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, ((l - max) / t).exp())).collect();
        let sum: f64 = probs.iter().map(|x| x.1 as f64).sum();
        let prob = |w: f32| w as f64 / sum;
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let n = probs.len();
        let mut limit = if p.top_k > 0 { p.top_k.min(n) } else { n };
        if p.min_p > 0.0 {
            // min-p keeps the tokens at least min_p times as likely as the most likely one
            let top = probs.iter().fold(0.0f32, |m, x| m.max(x.1));
            let floor = prob(top) * p.min_p as f64;
            limit = limit.min(probs.iter().filter(|x| prob(x.1) >= floor).count().max(1));
        }
        let mut m = if p.top_p < 1.0 { limit.min(256) } else { limit };
        let kept = loop {
            if m < n {
                probs.select_nth_unstable_by(m - 1, order);
            }
            probs[..m].sort_unstable_by(order);
            // top-p: the shortest prefix whose mass reaches top_p
            let mut acc = 0.0f64;
            if p.top_p < 1.0 {
                if let Some(i) = probs[..m].iter().position(|x| {
                    acc += prob(x.1);
                    acc >= p.top_p as f64
                }) {
                    break i + 1;
                }
            }
            if m == limit {
                break m;
            }
            // The next prefix: 4 times longer, or longer still where the mass so far says so (each
            // later token holds at most the last one's mass, so m·top_p/acc tokens are too few).
            // Past a quarter of the vocabulary one more selection costs what sorting it all does.
            let wanted = (m as f64 * p.top_p as f64 / acc.max(f64::MIN_POSITIVE)).min(n as f64) as usize;
            m = (4 * m).max(wanted + wanted / 4);
            if m >= n / 4 {
                m = limit;
            }
            m = m.min(limit);
        };
        probs.truncate(kept);
        // renormalized over the kept tokens (in f64, as the cuts were taken)
        let kept_sum: f64 = probs.iter().map(|x| x.1 as f64).sum();
        for x in probs.iter_mut() {
            x.1 = (x.1 as f64 / kept_sum) as f32;
        }
        probs
    }
}

/// The first index of the largest value.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The `k` largest entries, largest first (ties: lower id first). Selects before sorting, so
/// per-token logprobs over a 262k vocabulary do not sort the whole row.
pub fn top_k(v: &[f32], k: usize) -> Vec<(u32, f32)> {
    let order = |a: &u32, b: &u32| v[*b as usize].total_cmp(&v[*a as usize]).then(a.cmp(b));
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return vec![];
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    idx.into_iter().map(|i| (i, v[i as usize])).collect()
}

/// log Σ exp(logits), accumulated in f64.
pub fn logsumexp(logits: &[f32]) -> f32 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    max + logits.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32
}

/// log softmax(logits / t) at `i`.
pub fn log_softmax_at(logits: &[f32], i: usize, t: f32) -> f32 {
    if t == 1.0 {
        return logits[i] - logsumexp(logits);
    }
    let scaled: Vec<f32> = logits.iter().map(|&x| x / t).collect();
    scaled[i] - logsumexp(&scaled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(logits: &[f32], t: f32) -> Vec<f64> {
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let e: Vec<f64> = logits.iter().map(|&x| (((x - max) / t) as f64).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    /// Empirical frequencies over 4,000 draws match softmax(logits / T) within 0.03: 4,000 draws
    /// give a standard error ≤ 0.008 per token, so 0.03 is > 3.5σ.
    #[test]
    fn sampling_matches_the_tempered_softmax() {
        let logits = [2.0f32, 1.5, 1.0, 0.3, -0.5, -1.0, 0.0, 0.8];
        for t in [0.7f32, 1.0, 2.0] {
            let mut s = Sampler::new(SamplingParams { temperature: t, seed: Some(7), ..Default::default() });
            let n = 4000;
            let mut counts = vec![0usize; logits.len()];
            for _ in 0..n {
                let mut l = logits;
                counts[s.sample(&mut l).token as usize] += 1;
            }
            let want = softmax(&logits, t);
            for (i, (&c, w)) in counts.iter().zip(&want).enumerate() {
                let f = c as f64 / n as f64;
                assert!((f - w).abs() <= 0.03, "T={t} token {i}: empirical {f:.3} vs softmax {w:.3}");
            }
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() });
            (0..20).map(|_| s.sample(&mut logits.clone()).token).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn top_k_top_p_and_min_p_cut_the_distribution() {
        let logits = [3.0f32, 2.0, 1.0, 0.0, -1.0];
        let d = |p: SamplingParams| Sampler::new(p).distribution(&logits).iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(d(SamplingParams { temperature: 1.0, top_k: 2, ..Default::default() }), vec![0, 1]);
        // softmax: 0.636, 0.234, 0.086, ... → top_p 0.8 keeps the first two (0.870 ≥ 0.8)
        assert_eq!(d(SamplingParams { temperature: 1.0, top_p: 0.8, ..Default::default() }), vec![0, 1]);
        // min_p 0.3: floor 0.19 keeps 0.636 and 0.234
        assert_eq!(d(SamplingParams { temperature: 1.0, min_p: 0.3, ..Default::default() }), vec![0, 1]);
    }

    /// `distribution` by a full sort of the vocabulary, as the cuts are defined.
    fn distribution_by_full_sort(p: &SamplingParams, logits: &[f32]) -> Vec<(u32, f32)> {
        let t = p.temperature.max(1e-6);
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut probs: Vec<(u32, f64)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, (((l - max) / t).exp()) as f64)).collect();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let sum: f64 = probs.iter().map(|x| x.1).sum();
        probs.iter_mut().for_each(|x| x.1 /= sum);
        if p.top_k > 0 {
            probs.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            if let Some(i) = probs.iter().position(|x| {
                acc += x.1;
                acc >= p.top_p as f64
            }) {
                probs.truncate(i + 1);
            }
        }
        let floor = probs[0].1 * p.min_p as f64;
        probs.retain(|x| x.1 >= floor);
        let sum: f64 = probs.iter().map(|x| x.1).sum();
        probs.into_iter().map(|(i, x)| (i, (x / sum) as f32)).collect()
    }

    /// The prefix-selecting cut keeps the tokens a full sort keeps, with the same probabilities,
    /// over peaked, flat and tied vocabularies and every combination of the three cuts. Both sum
    /// in f64, but in different orders (the full vocabulary by index there, by probability
    /// here), so the probabilities agree to rounding (1e-6) and a cut could move by one token
    /// where the mass meets top_p within rounding; none did over these cases.
    #[test]
    fn the_prefix_cut_is_the_full_sort_cut() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for case in 0..60 {
            let n = [50, 300, 5000, 40_000][case % 4];
            let spread = [0.05f32, 1.0, 4.0][case % 3];
            let logits: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() * 8.0 * spread).round() / 4.0).collect();
            for (top_k, top_p, min_p) in [(0, 0.9, 0.0), (0, 0.5, 0.0), (0, 0.999, 0.0), (40, 1.0, 0.0), (2000, 0.95, 0.0), (0, 1.0, 0.05), (0, 1.0, 0.9), (50, 0.9, 0.02), (0, 0.3, 0.5)] {
                let params = SamplingParams { temperature: [0.7f32, 1.0, 1.5][case % 3], top_k, top_p, min_p, ..Default::default() };
                let got = Sampler::new(params.clone()).distribution(&logits);
                let want = distribution_by_full_sort(&params, &logits);
                assert_eq!(got.len(), want.len(), "case {case} {params:?}: tokens kept");
                for (a, b) in got.iter().zip(&want) {
                    assert_eq!(a.0, b.0, "case {case} {params:?}: the order differs");
                    assert!((a.1 - b.1).abs() <= 1e-6, "case {case} {params:?}: token {} p {} vs {}", a.0, a.1, b.1);
                }
            }
        }
    }

    /// The CTRL rule on values where dividing and multiplying disagree: a negative logit must
    /// become more negative, not less.
    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() });
        s.accept(0);
        s.accept(1);
        let mut l = [4.0f32, -4.0, 1.0];
        s.adjust(&mut l);
        assert_eq!(l, [2.0, -8.0, 1.0]);
    }

    #[test]
    fn frequency_presence_and_bias() {
        let mut s = Sampler::new(SamplingParams { frequency_penalty: 0.5, presence_penalty: 0.25, logit_bias: vec![(2, 10.0)], ..Default::default() });
        s.accept(0);
        s.accept(0);
        let mut l = [1.0f32, 1.0, 1.0];
        s.adjust(&mut l);
        assert_eq!(l, [1.0 - 1.0 - 0.25, 1.0, 11.0]);
        let mut l = [1.0f32, 1.0, 1.0];
        assert_eq!(s.sample(&mut l).token, 2);
    }
}
