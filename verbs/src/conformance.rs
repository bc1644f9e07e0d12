//! Provider conformance suite, written once and run against every provider.
