//! Seeded k-means (Lloyd's iterations from k-means++-style seeding on a sample) over flat `f32`
//! rows, shared by the index's coarse quantiser and its product-quantiser codebooks. Pure and
//! deterministic: the same rows, `k` and seed give the same centroids.

/// splitmix64: the seeded draws of the seeding.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Squared Euclidean distance (`a` and `b` of equal length).
pub fn squared_distance(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// The row of `rows` (each `dim` wide) nearest to `point`, and its squared distance.
pub fn nearest(rows: &[f32], dim: usize, point: &[f32]) -> (usize, f32) {
    rows.chunks_exact(dim)
        .map(|c| squared_distance(c, point))
        .enumerate()
        .fold(
            (0, f32::INFINITY),
            |best, (i, d)| {
                if d < best.1 {
                    (i, d)
                } else {
                    best
                }
            },
        )
}

/// `k` centroids (flat, `k × dim`) of `rows` after `iterations` Lloyd steps. With fewer rows
/// than `k`, the rows themselves (repeated) are the centroids. An empty cluster keeps its
/// previous centroid.
pub fn kmeans(rows: &[f32], dim: usize, k: usize, iterations: usize, seed: u64) -> Vec<f32> {
    let n = rows.len().checked_div(dim).unwrap_or(0);
    if n == 0 || k == 0 {
        return vec![0.0; k.saturating_mul(dim)];
    }
    let row = |i: usize| &rows[i * dim..(i + 1) * dim];
    let mut state = seed;
    // k-means++ seeding: each next centroid is a row drawn with probability ∝ its squared
    // distance to the nearest centroid so far.
    let mut centroids: Vec<f32> = Vec::with_capacity(k * dim);
    centroids.extend_from_slice(row((splitmix64(&mut state) % n as u64) as usize));
    let mut closest: Vec<f32> = (0..n)
        .map(|i| squared_distance(row(i), &centroids[..dim]))
        .collect();
    while centroids.len() < k * dim {
        let total: f64 = closest.iter().map(|d| f64::from(*d)).sum();
        let pick = if total <= 0.0 {
            (splitmix64(&mut state) % n as u64) as usize
        } else {
            let u = (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64 * total;
            let mut acc = 0.0;
            closest
                .iter()
                .position(|d| {
                    acc += f64::from(*d);
                    acc > u
                })
                .unwrap_or(n - 1)
        };
        let start = centroids.len();
        centroids.extend_from_slice(row(pick));
        for (i, c) in closest.iter_mut().enumerate() {
            *c = c.min(squared_distance(row(i), &centroids[start..start + dim]));
        }
    }
    let mut assignment = vec![0usize; n];
    for _ in 0..iterations {
        for (i, a) in assignment.iter_mut().enumerate() {
            *a = nearest(&centroids, dim, row(i)).0;
        }
        let mut sums = vec![0.0f64; k * dim];
        let mut counts = vec![0usize; k];
        for (i, &a) in assignment.iter().enumerate() {
            counts[a] += 1;
            for (s, x) in sums[a * dim..(a + 1) * dim].iter_mut().zip(row(i)) {
                *s += f64::from(*x);
            }
        }
        for (c, count) in counts.iter().enumerate() {
            if *count > 0 {
                for (dst, s) in centroids[c * dim..(c + 1) * dim]
                    .iter_mut()
                    .zip(&sums[c * dim..(c + 1) * dim])
                {
                    *dst = (*s / *count as f64) as f32;
                }
            }
        }
    }
    centroids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_clear_clusters_are_found_whatever_the_seed() {
        let rows = [
            0.0, 0.0, 0.1, 0.0, 0.0, 0.1, 10.0, 10.0, 10.1, 10.0, 10.0, 10.1,
        ];
        for seed in 0..8 {
            let c = kmeans(&rows, 2, 2, 5, seed);
            let mut firsts = [c[0], c[2]];
            firsts.sort_by(f32::total_cmp);
            assert!(
                (firsts[0] - 0.033).abs() < 0.01 && (firsts[1] - 10.033).abs() < 0.01,
                "{c:?}"
            );
        }
        assert_eq!(kmeans(&rows, 2, 2, 5, 3), kmeans(&rows, 2, 2, 5, 3));
    }

    #[test]
    fn fewer_rows_than_centroids_and_empty_input() {
        let c = kmeans(&[1.0, 2.0], 2, 3, 2, 0);
        assert_eq!(c.len(), 6);
        assert_eq!(&c[..2], &[1.0, 2.0]);
        assert_eq!(kmeans(&[], 2, 2, 2, 0), vec![0.0; 4]);
    }
}
