"""Data sifting: score a batch, keep the samples that teach most, train on those."""
