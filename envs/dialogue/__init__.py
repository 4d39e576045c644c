"""A customer-service dialogue with a simulated user, scored by whether the case is resolved and, with a rubric,
by how the conversation went."""
