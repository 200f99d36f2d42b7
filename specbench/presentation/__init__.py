"""What people read: leaderboard tables, figures, the regression check, recommendations."""
