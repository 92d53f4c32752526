"""What the tests share: stand-ins (Triton's compiled kernel, CUDA's streams and events),
helpers that drive the relay, and the rules written from upstream's behaviour that the
tests hold spec_fused to. No test module imports another test module; they import this."""
