"""All IR data structures, printers, verifiers and interpreters; imports nothing else of polyfuse."""
