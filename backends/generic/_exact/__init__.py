"""Device-generic exact primitives: plain tensor ops exact on any IEEE device."""
