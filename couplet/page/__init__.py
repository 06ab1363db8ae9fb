"""The page's pieces that `app.py` assembles: the gate (`gate`), the charts (`charts`), the tables and panels
(`view`), the share link (`share`) and the printable set (`printing`)."""
