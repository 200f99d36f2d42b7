"""Running a benchmark: config checks, the method registry, the session that times and records."""
