//! Zipf-distributed key ranks (rank `r` of `n` drawn with weight `1 / r^s`), by inverse CDF
//! over the precomputed cumulative weights: the skewed update streams of `Mode::Latest`'s
//! test and benchmark.

use rand::Rng;

/// Draws ranks `0..n` (0 the most frequent) with Zipf exponent `s`.
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=n)
            .map(|rank| {
                total += 1.0 / (rank as f64).powf(s);
                total
            })
            .collect();
        Self { cumulative }
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(0.0);
        let target = rng.gen_range(0.0..total);
        self.cumulative
            .partition_point(|&c| c <= target)
            .min(self.cumulative.len().saturating_sub(1))
    }
}
