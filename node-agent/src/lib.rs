//! holdfast node agent (placeholder; see issues 4-6).
