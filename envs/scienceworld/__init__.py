"""ScienceWorld (the 30 elementary-science task types) through the scienceworld package's simulator."""
