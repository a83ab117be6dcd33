"""What people look at: tables, plots, HTML pages, an explanation's attention."""
